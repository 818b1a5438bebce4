"""Producers that do not import Ratchet's agents: Celery tasks sent by name with JSON arguments,
and a producer whose broker is down at enqueue time (the run is kept and published later)."""

from __future__ import annotations

import uuid

import pytest
from celery import Celery

from orchestrator import Agent, BrokerUnavailableError, Client, RunNotFoundError, RunStatus, Session
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.testing.waiting import wait_until


@pytest.mark.usefixtures("worker", "scripted")
def test_a_plain_celery_producer_starts_and_continues_runs_by_task_name(settings: Settings) -> None:
    name = f"by-name-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=OpenAIChat(id="gpt-4o-mini"), instructions="Be brief.")
    # A producer that knows only the broker URL, the task name and the queue.
    producer = Celery(broker=settings.broker_url, set_as_current=False)
    producer.conf.task_serializer = "json"
    run_id = str(uuid.uuid4())

    producer.send_task(
        "ratchet.start_run", args=[name, "hello by name", "s-by-name", run_id], queue=settings.control_queue
    )

    client = Client(settings)
    wait_until(lambda: client.get_run(run_id), 30, what="the run to be written", ignore=(RunNotFoundError,))
    out = client.wait(run_id, timeout=30)
    assert out.status == RunStatus.COMPLETED and out.session_id == "s-by-name"
    assert [m.content for m in out.messages if m.role == "user"] == ["hello by name"]

    # Redelivering the same start_run (at-least-once) does not start the run twice.
    producer.send_task(
        "ratchet.start_run", args=[name, "hello by name", "s-by-name", run_id], queue=settings.control_queue
    )
    producer.send_task("ratchet.continue_run", args=[run_id, "and again"], queue=settings.control_queue)

    def fork_finished() -> Session | None:
        s = client.get_session("s-by-name")
        # Every run final, however many: the count below is then what is checked, not waited for.
        return s if s and len(s.runs) >= 2 and all(r.status.is_final for r in s.runs) else None

    session = wait_until(fork_finished, 30, what="the continued run's fork to finish")
    assert len(session.runs) == 2  # the original and one fork from continue
    assert session.runs[1].forked_from == run_id
    producer.close()


@pytest.mark.usefixtures("worker", "scripted")
def test_a_run_enqueued_while_the_broker_is_down_is_kept_and_runs_once_it_is_back(settings: Settings) -> None:
    name = f"down-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=OpenAIChat(id="gpt-4o-mini"), instructions="Be brief.")
    down = Client(settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"}))

    with pytest.raises(BrokerUnavailableError, match="saved as QUEUED .* nothing is lost") as caught:
        down.start(name, input="are you there?")

    client = Client(settings)
    run_id = caught.value.run_id
    assert client.get_run(run_id).messages[0].content == "are you there?"
    # The sweeper of the worker, whose broker is up, publishes it: nobody re-sends anything.
    out = client.wait(run_id, timeout=30)
    assert out.status == RunStatus.COMPLETED
