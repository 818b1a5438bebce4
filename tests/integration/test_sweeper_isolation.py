"""One run that the sweeper cannot handle does not stop its pass: the others are still swept,
and the failed one is logged with its run id and tried again on the next pass. On SQLite and
PostgreSQL."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from orchestrator import Agent, RunStatus
from orchestrator import agent as agent_module
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat
from orchestrator.runtime import build
from orchestrator.steps import StepRunner
from orchestrator.store import Store, forget_stores
from orchestrator.sweeper import Sweeper
from tests.conftest import make_settings
from tests.integration.db_faults import failing_updates
from tests.support import Clock
from workers.celery.dispatch import CeleryDispatcher

S = RunStatus


class Unrenderable(Agent):
    """An agent whose system message cannot be rendered (a template that fails, say)."""

    def render_system_message(self) -> str | None:
        raise RuntimeError("the instructions template is missing")


@pytest.fixture
def sweeper(db_url: str, redis_url: str, clock: Clock) -> Iterator[Sweeper]:
    settings = make_settings(db_url, redis_url, max_step_attempts=2)
    store = Store(Store.open(db_url).engine, clock=clock)
    engine = StepRunner(build(settings, store=store, dispatcher=CeleryDispatcher(settings)))
    yield Sweeper(engine)
    engine.dispatcher.app.close()  # type: ignore[attr-defined]
    forget_stores()


@pytest.fixture
def unrenderable() -> Iterator[Unrenderable]:
    """An agent that cannot render its system message, registered for the test only: a catalog
    written later in this process (a worker's boot, the in-memory dispatcher's first step) would
    fail to describe it."""
    agent = Unrenderable(name=f"unrenderable-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="m"))
    yield agent
    agent_module._registry.pop(agent.name, None)
    agent_module._sites.pop(agent.name, None)


def running(sweeper: Sweeper, agent: str = "nobody", *, claims: int = 1, lease: float = 30.0) -> str:
    """A run whose step was claimed `claims` times, by workers that then died."""
    store, run_id = sweeper.store, str(uuid.uuid4())
    store.create_run(
        run_id=run_id, session_id=f"s-{run_id[:8]}", agent_name=agent, kind="agent",
        input_messages=[Message(role="user", content="hello")], publish_grace=30,
    )  # fmt: skip
    for i in range(claims):
        if i:
            store.move(run_id, src=(S.RUNNING,), dst=S.QUEUED, epoch=None, lease_owner=None, lease_expires_at=None)
        assert store.claim(run_id, 0, "model", owner=f"dead-{i}", lease_seconds=lease, max_attempts=5) is not None
    return run_id


def test_a_run_whose_update_fails_does_not_stop_the_pass_for_the_others(
    sweeper: Sweeper, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # Given two runs whose workers died, the first of which the database refuses to update
    broken = running(sweeper, lease=30.0)
    fine = running(sweeper, lease=30.5)
    clock.offset = 31  # both leases expired, the broken one first
    caplog.set_level(logging.ERROR, logger="ratchet.sweeper")
    with failing_updates(sweeper.store.engine, broken):
        report = sweeper.sweep_once()

    # Then the pass went on: the other run is back in the queue, the broken one is logged by id
    # (the PostgreSQL database is the test session's: other tests' runs may be swept too)
    assert fine in report.requeued and broken in report.failed and broken not in report.requeued
    assert sweeper.store.get_record(fine).status == S.QUEUED
    assert sweeper.store.get_record(broken).status == S.RUNNING
    assert any(broken in r.getMessage() and r.exc_info for r in caplog.records)
    # And the next pass, the database working again, takes it back too
    assert broken in sweeper.sweep_once().requeued


def test_a_poison_step_whose_agent_cannot_render_its_system_message_still_errors_and_the_pass_goes_on(
    sweeper: Sweeper, clock: Clock, unrenderable: Unrenderable
) -> None:
    # Given a poison step (claimed twice, the cap) of an agent whose system message fails to render,
    # and a step whose publish is overdue
    poison = running(sweeper, unrenderable.name, claims=2)
    due = str(uuid.uuid4())
    sweeper.store.create_run(
        run_id=due, session_id="s-due", agent_name="nobody", kind="agent",
        input_messages=[Message(role="user", content="hello")], publish_grace=1,
    )  # fmt: skip
    clock.offset = 31

    report = sweeper.sweep_once()

    # Then the poison step is in ERROR (without a system message), and the overdue one was published
    assert poison in report.poisoned and due in report.republished
    assert not {poison, due} & set(report.failed)
    out = sweeper.store.get_output(poison)
    assert out.status == S.ERROR and out.error is not None and out.error.type == "PoisonStepError"
    assert [m.role for m in out.messages] == ["user"]
