"""The lease heartbeat, on SQLite and PostgreSQL: a step that runs longer than its lease keeps its
claim while its worker lives; a renewal never revives a claim that is gone, never outlives the
hard time limit, and survives a database error.

The full-stack test runs a real Celery worker in this process (threads pool), so its heartbeat
thread and the tool it keeps alive are both here; the killed-worker case is tests/chaos."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from orchestrator import Agent, Client, RunStatus, ToolContext
from orchestrator.heartbeat import Heartbeat
from orchestrator.messages import Message
from orchestrator.steps.inflight import InFlight
from orchestrator.store import Claim, Store, forget_stores
from orchestrator.store.transcripts import Transcript
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings
from tests.integration.db_faults import failing_updates
from tests.support import Clock
from workers.celery.embedded import EmbeddedWorker
from workers.celery.tasks import runner_for

S = RunStatus


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    yield Store.open(db_url)
    forget_stores()


def held_step(store: Store, *, lease_seconds: float = 30.0, clock: Clock | None = None) -> InFlight:
    """A new run, claimed as a worker would, and the engine's record of holding it."""
    run_id = str(uuid.uuid4())
    store.create_run(
        run_id=run_id, session_id=f"s-{run_id[:8]}", agent_name="nobody", kind="agent",
        input_messages=[Message(role="user", content="hello")], publish_grace=60,
    )  # fmt: skip
    claim = store.claim(run_id, 0, "model", owner=f"host:1:{run_id}", lease_seconds=lease_seconds, max_attempts=5)
    assert claim is not None
    return InFlight(epoch=claim.epoch, run_id=run_id, owner=f"host:1:{run_id}", claimed_at=claim.record.updated_at)


def expiry(store: Store, step: InFlight) -> float:
    expires = store.get_record(step.run_id).lease_expires_at
    assert expires is not None
    return expires


def test_a_step_that_runs_longer_than_its_lease_keeps_its_claim_and_runs_once(db_url: str, redis_url: str) -> None:
    settings = make_settings(db_url, redis_url, lease_seconds=2.0, heartbeat_seconds=0.5)
    started, release = threading.Event(), threading.Event()
    runs: list[str] = []

    def slow(ctx: ToolContext) -> str:
        """Hold until the test lets go."""
        runs.append(ctx.idempotency_key)
        started.set()
        if not release.wait(30):
            raise TimeoutError("never released")
        return "done"

    agent = Agent(
        name=f"hb-{uuid.uuid4().hex[:8]}", model=ScriptedModel(script=ScriptConfig(tool_batches=1)), tools=[slow],
        client=Client(settings),
    )  # fmt: skip
    with EmbeddedWorker(settings) as worker:
        store = runner_for(worker.app).store
        # Given a tool that is still running when its claim's first lease runs out
        handle = agent.start("go")
        assert started.wait(20), "the tool never started"
        first = store.get_record(handle.run_id)
        assert first.status == S.RUNNING and first.lease_expires_at is not None

        # When it keeps running well past that, while the sweeper (every 0.5 s) looks for expired leases
        wait_until(
            lambda: time.time() > first.lease_expires_at + 2 * settings.sweep_seconds,  # type: ignore[operator]
            timeout=10, what="two sweeps past the first lease",
        )  # fmt: skip

        # Then the claim is still the same one, renewed
        now = store.get_record(handle.run_id)
        assert (now.status, now.epoch, now.lease_owner) == (S.RUNNING, first.epoch, first.lease_owner)
        assert now.lease_expires_at is not None and now.lease_expires_at > first.lease_expires_at
        release.set()
        out = handle.wait(30)
        # And the heartbeat stops once the process holds no step
        heartbeat = runner_for(worker.app).heartbeat
        wait_until(lambda: not heartbeat.running, timeout=10, what="the heartbeat thread to end")

    assert out.status == S.COMPLETED
    assert len(runs) == 1, f"the tool ran {len(runs)} times"
    assert "lease_expired" not in [e["kind"] for e in store.get_events(handle.run_id)]


def test_one_beat_renews_every_held_step_and_drops_those_whose_claim_is_gone(db_url: str, store: Store) -> None:
    settings = make_settings(db_url, "memory://", lease_seconds=60.0)
    live, fenced, cancelled = (held_step(store) for _ in range(3))
    before = {s.run_id: expiry(store, s) for s in (live, fenced, cancelled)}
    # Given one claim taken over by the sweeper (new epoch) and one run cancelled
    store.move(fenced.run_id, src=(S.RUNNING,), dst=S.QUEUED, epoch=fenced.epoch, bump_epoch=True)
    store.move(cancelled.run_id, src=(S.RUNNING,), dst=S.CANCELLED, lease_owner=None, lease_expires_at=None)

    Heartbeat(store, settings, lambda: [live, fenced, cancelled]).beat()

    # Then the live claim's lease was extended by a whole lease, and the others are no longer renewed
    assert expiry(store, live) > before[live.run_id] + 25
    assert (live.renewing, fenced.renewing, cancelled.renewing) == (True, False, False)
    assert store.get_record(fenced.run_id).lease_expires_at == before[fenced.run_id]  # not revived


def test_a_beat_that_names_the_epoch_a_fallback_just_left_keeps_renewing_the_step(db_url: str, store: Store) -> None:
    settings = make_settings(db_url, "memory://", lease_seconds=60.0)
    step = held_step(store)
    # Given a step moving to its fallback model: the move committed (new epoch), and the step's
    # record still names the old one, as a beat that read it just before the move does
    step.moves += 1
    held = Claim(record=store.get_record(step.run_id), transcript=Transcript())
    moved = store.fall_back(held, index=1, lease_seconds=60.0, error={"type": "E", "message": "m"})

    Heartbeat(store, settings, lambda: [step]).beat()

    # Then that renewal failed (it named the old epoch) without the claim taken for lost
    assert step.renewing
    step.epoch, step.moves = moved.epoch, step.moves + 1
    before = expiry(store, step)
    Heartbeat(store, settings, lambda: [step]).beat()
    assert step.renewing and expiry(store, step) >= before


def test_a_step_past_its_hard_time_limit_is_no_longer_renewed(db_url: str) -> None:
    settings = make_settings(db_url, "memory://", lease_seconds=60.0)
    clock = Clock()
    store = Store(Store.open(db_url).engine, clock=clock)
    try:
        step = held_step(store)
        before = expiry(store, step)
        clock.offset = settings.hard_time_limit + 1  # a stuck step on a pool without time limits

        Heartbeat(store, settings, lambda: [step]).beat()

        assert not step.renewing and expiry(store, step) == before
    finally:
        forget_stores()


def test_a_database_error_in_a_beat_is_logged_and_the_next_beat_renews(
    db_url: str, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(db_url, "memory://", lease_seconds=3.0, heartbeat_seconds=0.1)
    step = held_step(store, lease_seconds=3.0)
    before = expiry(store, step)
    held = [step]
    heartbeat = Heartbeat(store, settings, lambda: held)
    caplog.set_level(logging.WARNING, logger="ratchet.heartbeat")
    try:
        # Given a database that fails every renewal of the step
        with failing_updates(store.engine, step.run_id):
            heartbeat.wake()
            wait_until(
                lambda: sum("lease heartbeat failed" in r.getMessage() for r in caplog.records) >= 2,
                timeout=10, what="two failed beats",
            )  # fmt: skip
            assert expiry(store, step) == before

        # Then the thread is still beating, and renews the lease once the database works again
        wait_until(lambda: expiry(store, step) > before, timeout=10, what="a renewal after the failures")
        assert heartbeat.running and step.renewing
    finally:
        held.clear()  # the process holds no step now: the thread ends
    wait_until(lambda: not heartbeat.running, timeout=10, what="the heartbeat thread to end")
