"""A run's deadline on a real worker, on PostgreSQL: a run started by the `ratchet.start_run` task by
name with `run_timeout`, its model call held in flight at the scripted server, is stopped by the
worker's own sweeper (RATCHET_SWEEP_SECONDS 0.5 here) in ERROR with RunTimeoutError while the call
is still in flight; when the call returns, its commit is fenced; a continue with a new run_timeout
completes it. Every case stepped inline: tests/unit/test_run_deadlines_inline.py."""

from __future__ import annotations

import uuid

import pytest
from celery import Celery

from orchestrator import Agent, Client, RunStatus
from orchestrator.errors import RunNotFoundError
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings
from tests.integration.fencing import wait_for_late_commit

S = RunStatus
RUN_TIMEOUT = 1.0
#: How long after its deadline the sweeper may act on a loaded machine: a few sweep intervals.
LATE = 15.0


@pytest.fixture
def settings(pg_url: str, redis_url: str) -> Settings:
    """The worker's settings, on PostgreSQL only (one worker-backed test)."""
    return make_settings(pg_url, redis_url)


@pytest.mark.usefixtures("worker")
def test_a_workers_sweeper_stops_a_run_mid_model_call_at_its_deadline_and_fences_the_call(
    settings: Settings, scripted: ScriptedServer
) -> None:
    model = f"held-{uuid.uuid4().hex[:6]}"
    agent = Agent(name=f"deadline-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id=model))
    producer = Celery(broker=settings.broker_url, set_as_current=False)
    producer.conf.task_serializer = "json"
    client, run_id = Client(settings), str(uuid.uuid4())
    scripted.holding.hold(model)

    producer.send_task(
        "ratchet.start_run",
        args=[agent.name, "hello"],
        kwargs={"run_id": run_id, "run_timeout": RUN_TIMEOUT},
        queue=settings.control_queue,
    )
    wait_until(
        lambda: scripted.requests_for(run_id), 30, what="the model call to be in flight", ignore=(RunNotFoundError,)
    )
    record = client.store.get_record(run_id)
    assert record.run_timeout == RUN_TIMEOUT and record.deadline_at is not None

    stopped = wait_until(
        lambda: (out := client.get_run(run_id)).status == S.ERROR and out,
        timeout=RUN_TIMEOUT + LATE,
        what="the worker's sweeper to stop the run at its deadline",
    )
    assert stopped.error is not None and stopped.error.type == "RunTimeoutError"
    [logged] = [e for e in client.store.get_events(run_id) if e["kind"] == "error"]
    assert record.deadline_at <= logged["at"] < record.deadline_at + LATE
    assert [m.role for m in stopped.messages] == ["user"]

    scripted.holding.release()
    events = wait_for_late_commit(client.store, client.store.get_record(run_id))
    assert "fenced" in [e["kind"] for e in events], f"the call's commit got through after the deadline: {events}"
    assert client.get_run(run_id).messages == stopped.messages

    resumed = client.continue_run(run_id, run_timeout=60)
    done = client.wait(resumed.run_id, timeout=30)
    assert done.status == S.COMPLETED and done.run_id == run_id and done.run_timeout == 60
