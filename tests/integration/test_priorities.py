"""Priorities on real brokers: runs started with a priority while no worker runs (a backlog),
then one worker with one slot takes them. Its steps go highest first, on Redis (kombu's priority
lists, served 9 first by `workers.celery.broker.Channel`) and on RabbitMQ (x-max-priority queues).
Which step ran when is read from the store: each step's messages are stamped when it commits."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
import redis

from orchestrator import Agent, Client, RunStatus, Settings
from orchestrator.testing.script import ScriptConfig
from tests.conftest import make_settings
from tests.support import CountingModel
from workers.celery.app import START_TASK, SWEEP_TASK, create_app
from workers.celery.broker import queue_lists
from workers.celery.embedded import EmbeddedWorker

S = RunStatus
pytestmark = [pytest.mark.redis]


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def backlog(client: Client, agent: str, priorities: Iterable[int | None]) -> dict[str, int | None]:
    """Start one run per priority, lowest first, and return {run_id: priority}."""
    return {client.start(agent, input=f"p{p}", priority=p).run_id: p for p in priorities}


def drain(settings: Settings, client: Client, runs: Iterable[str]) -> None:
    """One worker with one slot takes the backlog until every run has completed."""
    with EmbeddedWorker(settings, concurrency=1, sweep=False):
        for run_id in runs:
            out = client.wait(run_id, timeout=60)
            assert out.status == S.COMPLETED, (out.error, out.run_id)


def step_times(client: Client, run_id: str) -> list[float]:
    """When each step of the run committed: the stamps of the messages the worker wrote."""
    return [m.created_at for m in client.get_run(run_id).messages[1:] if m.created_at is not None]


def assert_priority_order(client: Client, runs: dict[str, int | None]) -> None:
    """Every step of a run of a higher priority committed before any step of a lower one."""
    levels = sorted({p or 0 for p in runs.values()}, reverse=True)
    spans = {
        level: [t for run_id, p in runs.items() if (p or 0) == level for t in step_times(client, run_id)]
        for level in levels
    }
    for higher, lower in itertools.pairwise(levels):
        assert max(spans[higher]) < min(spans[lower]), f"a step of priority {lower} ran before one of {higher}"


def test_on_redis_a_backlogs_high_priority_runs_take_every_step_first_and_keep_their_priority(
    settings: Settings,
) -> None:
    # Given runs of one tool batch each (model, tools, model), lowest priority queued first
    agent = Agent(name=f"ranked-{uuid.uuid4().hex[:6]}", model=CountingModel(), tools=[lookup])
    client = Client(settings)
    runs = backlog(client, agent.name, [None, 0, 2, 5, 9, None, 5, 9])
    assert {r: client.get_run(r).priority for r in runs} == runs  # stored with each run

    # When one worker with one slot drains them
    drain(settings, client, runs)

    # Then each run's later steps (published by the worker, on two queues) kept its priority:
    # a high run's tool batch and next model call went before every lower run's first step
    assert_priority_order(client, runs)


def test_on_rabbitmq_a_backlogs_high_priority_runs_go_first(amqp_settings: Settings) -> None:
    # Given one-step runs queued on RabbitMQ, lowest first (priorities order one queue there)
    agent = Agent(name=f"ranked-{uuid.uuid4().hex[:6]}", model=CountingModel(script=ScriptConfig(tool_batches=0)))
    client = Client(amqp_settings)
    runs = backlog(client, agent.name, [None, 1, 4, 8, 9, 0, 8, 4])

    # When one worker with one slot drains them, then they ran highest first
    drain(amqp_settings, client, runs)
    assert_priority_order(client, runs)


@pytest.mark.parametrize("how", ["send_task", "apply_async"])
def test_on_redis_a_task_sent_without_a_priority_waits_in_the_list_of_no_priority(
    redis_url: str, tmp_path: Path, how: str
) -> None:
    # Given the app Ratchet runs (beat sends its sweep through it; Flower and `send_task` a start)
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    app = create_app(settings)
    client = redis.Redis.from_url(settings.broker_url)
    try:
        # When a task is sent by name, or called, with no priority
        if how == "send_task":
            app.send_task(START_TASK, args=["run-x"])
        else:
            app.tasks[SWEEP_TASK].apply_async()
        # Then it waits in the list served last, with runs of no priority, not in the one served first
        lengths = [client.llen(name) for name in queue_lists(settings.control_queue)]
        assert lengths == [0] * 9 + [1], lengths
    finally:
        client.close()
        app.close()
