"""Crash safety that one process can show, on SQLite and PostgreSQL: claims and fencing,
concurrent deliveries and continues, the sweeper, the poison cap and retries. Real Redis, real
Celery (an in-process worker), the real openai client against the scripted model. Worker
processes that are killed, frozen or time-limited: tests/chaos. What needs no broker (a retry
parked for the sweeper, a stale delivery, an interrupted at-most-once tool, a continue after a
lease expired): tests/unit/test_steps_inline.py, with the in-memory dispatcher.

Lease expiry is shown by moving the store's clock (a lease is a time, and the store reads time
from its `clock`), never by waiting for a short real lease: on a loaded machine a lease that must
stay live for a few steps of the test could run out first.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from orchestrator import Agent, Client, RetryPolicy, RunStatus
from orchestrator.errors import FencedError
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat
from orchestrator.runtime import build
from orchestrator.settings import Settings
from orchestrator.steps import StepRunner
from orchestrator.store import Claim, Store
from orchestrator.sweeper import Sweeper
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings
from tests.support import Clock, clocked_store, new_run
from workers.celery.broker import queue_lists
from workers.celery.dispatch import CeleryDispatcher
from workers.celery.embedded import EmbeddedWorker
from workers.cli import commands as cli

S = RunStatus
QUICK_RETRIES = RetryPolicy(base=0.05, factor=2.0, max_delay=0.1)


@pytest.fixture
def store(settings: Settings, clock: Clock) -> Store:
    return clocked_store(settings, clock)


def claim(store: Store, run_id: str, seq: int = 0, kind: str = "model", owner: str = "w1") -> Claim | None:
    return store.claim(run_id, seq, kind, owner=owner, lease_seconds=30.0, max_attempts=5)


def assistant(text: str = "hi") -> Message:
    return Message(role="assistant", content=text)


def queued(redis_url: str, queue: str) -> int:
    """Messages waiting in a queue (kombu's Redis transport keeps one list per queue and priority)."""
    client = redis.Redis.from_url(redis_url)
    return sum(int(client.llen(name)) for name in queue_lists(queue))


def define(settings: Settings, **kwargs: object) -> Agent:
    return Agent(
        name=f"rel-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="gpt-4o-mini"), client=Client(settings), **kwargs
    )  # type: ignore[arg-type]


@pytest.fixture
def sweeper(settings: Settings, store: Store) -> Iterator[Sweeper]:
    engine = StepRunner(build(settings, store=store, dispatcher=CeleryDispatcher(settings)))
    yield Sweeper(engine)
    engine.dispatcher.app.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- claim and fencing


def test_lease_sweep_interval_and_attempt_cap_are_settings() -> None:
    settings = Settings.from_env(
        {"RATCHET_LEASE_SECONDS": "900", "RATCHET_SWEEP_SECONDS": "5", "RATCHET_MAX_STEP_ATTEMPTS": "7"}
    )
    assert (settings.lease_seconds, settings.sweep_seconds, settings.max_step_attempts) == (900, 5, 7)


def test_a_claim_bumps_the_epoch_and_takes_a_lease_and_a_duplicate_delivery_does_nothing(
    store: Store, clock: Clock
) -> None:
    run_id = new_run(store)

    first = claim(store, run_id, owner="w1")

    assert first is not None and first.epoch == 1
    assert first.record.status == S.RUNNING and first.record.lease_owner == "w1" and first.record.attempts == 1
    assert first.record.lease_expires_at == pytest.approx(clock() + 30, abs=1)
    assert [m.content for m in first.messages] == ["hello"]
    # The same step delivered again, a later step, and the other kind of step: all dropped.
    assert claim(store, run_id, owner="w2") is None
    assert claim(store, run_id, seq=1, owner="w2") is None
    assert claim(store, run_id, kind="tools", owner="w2") is None
    record = store.get_record(run_id)
    assert (record.epoch, record.lease_owner, record.attempts) == (1, "w1", 1)


def test_a_worker_whose_lease_was_taken_over_is_fenced_and_its_writes_roll_back(store: Store, clock: Clock) -> None:
    run_id = new_run(store)
    old = claim(store, run_id, owner="old")
    assert old is not None
    clock.advance(31)
    new = claim(store, run_id, owner="new")
    assert new is not None and new.epoch == old.epoch + 1 and new.record.attempts == 2

    with pytest.raises(FencedError, match="taken over"):
        store.commit_step(old, [assistant("stale")], status=S.QUEUED, next_step="tools", publish_grace=60)
    with pytest.raises(FencedError):
        store.append_tool_result(old, Message(role="tool", tool_call_id="c1", content="stale"))
    with pytest.raises(FencedError):
        store.record_tool_start(old, "c1", "charge")
    with pytest.raises(FencedError):
        store.park_for_retry(old, delay=1, published=True, error={"type": "X", "message": "x"}, publish_grace=60)

    assert [m.content for m in store.get_messages(run_id)] == ["hello"]
    assert store.started_tool_calls(run_id) == set()
    committed = store.commit_step(new, [assistant("fresh")], status=S.COMPLETED, next_step=None, publish_grace=60)
    assert committed.status == S.COMPLETED
    assert [m.content for m in store.get_messages(run_id)] == ["hello", "fresh"]


def test_a_step_claimed_again_by_the_same_owner_fences_the_first_claim_by_its_epoch_alone(
    store: Store, clock: Clock
) -> None:
    # Given a claim whose lease ran out, and the same message delivered again to the same worker
    # process: the same host, pid and task id, so the same owner, and a lease live again
    run_id = new_run(store)
    first = claim(store, run_id, owner="host:1:task-a")
    assert first is not None
    clock.advance(31)
    second = claim(store, run_id, owner="host:1:task-a")
    assert second is not None and second.record.lease_owner == first.record.lease_owner
    assert second.epoch == first.epoch + 1

    # Then every write of the first claim is fenced: the owner and the lease match, only the epoch moved
    with pytest.raises(FencedError, match="taken over"):
        store.commit_step(first, [assistant("stale")], status=S.COMPLETED, next_step=None, publish_grace=60)
    with pytest.raises(FencedError):
        store.append_tool_result(first, Message(role="tool", tool_call_id="c1", content="stale"))
    with pytest.raises(FencedError):
        store.record_tool_start(first, "c1", "charge")
    with pytest.raises(FencedError):
        store.park_for_retry(first, delay=1, published=True, error={"type": "X", "message": "x"}, publish_grace=60)
    record = store.get_record(run_id)
    assert (record.status, record.epoch, record.n_messages) == (S.RUNNING, second.epoch, 1)
    assert store.started_tool_calls(run_id) == set()
    # And the second claim commits
    done = store.commit_step(second, [assistant("fresh")], status=S.COMPLETED, next_step=None, publish_grace=60)
    assert done.status == S.COMPLETED
    assert [m.content for m in store.get_messages(run_id)] == ["hello", "fresh"]


def test_a_worker_whose_lease_expired_cannot_write_even_before_anyone_took_over(
    store: Store, clock: Clock, sweeper: Sweeper
) -> None:
    run_id = new_run(store)
    late = claim(store, run_id, owner="frozen")
    assert late is not None
    clock.advance(31)

    with pytest.raises(FencedError):
        store.commit_step(late, [assistant("late")], status=S.QUEUED, next_step="tools", publish_grace=60)
    with pytest.raises(FencedError):
        store.append_tool_result(late, Message(role="tool", tool_call_id="c1", content="late"))
    with pytest.raises(FencedError):
        store.record_tool_start(late, "c1", "charge")
    with pytest.raises(FencedError):
        store.park_for_retry(late, delay=1, published=True, error={"type": "X", "message": "x"}, publish_grace=60)

    record = store.get_record(run_id)
    assert (record.status, record.epoch, record.n_messages) == (S.RUNNING, late.epoch, 1)
    # The sweeper takes it back, with a new epoch that fences the frozen worker for good.
    assert run_id in sweeper.sweep_once().requeued  # (PostgreSQL: other tests' runs share the database)
    record = store.get_record(run_id)
    assert (record.status, record.epoch, record.lease_owner) == (S.QUEUED, late.epoch + 1, None)
    assert [e["kind"] for e in store.get_events(run_id)] == ["lease_expired"]


def test_concurrent_deliveries_of_one_step_claim_it_exactly_once(store: Store, clock: Clock) -> None:
    run_id = new_run(store)

    def race(n: int = 8) -> list[Claim]:
        barrier = threading.Barrier(n)
        won: list[Claim] = []

        def deliver(i: int) -> None:
            barrier.wait()
            if (c := claim(store, run_id, owner=f"w{i}")) is not None:
                won.append(c)

        threads = [threading.Thread(target=deliver, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return won

    first = race()
    assert len(first) == 1 and first[0].epoch == 1
    # Once the lease expired, a crowd of redeliveries re-claims it once too.
    clock.advance(31)
    second = race()
    assert len(second) == 1 and second[0].epoch == 2
    assert store.get_record(run_id).attempts == 2


def test_a_step_is_not_claimed_past_the_attempt_cap_and_the_sweeper_errors_it(
    settings: Settings, store: Store, clock: Clock
) -> None:
    capped = settings.model_copy(update={"max_step_attempts": 2})
    sweeper = Sweeper(StepRunner(build(capped, store=store, dispatcher=CeleryDispatcher(capped))))
    run_id = new_run(store)
    for owner in ("first", "second"):  # each worker dies holding the step
        assert store.claim(run_id, 0, "model", owner=owner, lease_seconds=30, max_attempts=2) is not None
        clock.advance(31)

    # A late redelivery may not take it a third time...
    assert store.claim(run_id, 0, "model", owner="third", lease_seconds=30, max_attempts=2) is None
    # ...and the sweeper ends the loop.
    assert run_id in sweeper.sweep_once().poisoned
    out = store.get_output(run_id)
    assert out.status == S.ERROR and out.error is not None and out.error.type == "PoisonStepError"
    assert "claimed 2 times and never finished" in out.error.message
    assert [m.content for m in out.messages if m.role == "user"] == ["hello"]
    sweeper.runner.dispatcher.app.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- continue


def test_two_concurrent_continues_of_an_error_run_enqueue_one_step(
    settings: Settings, store: Store, redis_url: str
) -> None:
    run_id = new_run(store)
    held = claim(store, run_id)
    assert held is not None
    store.fail(run_id, epoch=held.epoch, error={"type": "AuthenticationError", "message": "401"})
    barrier = threading.Barrier(8)
    handles: list[str] = []

    def continue_it() -> None:
        client = Client(settings, store=store)
        barrier.wait()
        handles.append(client.continue_run(run_id).run_id)

    threads = [threading.Thread(target=continue_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert handles == [run_id] * 8
    assert queued(redis_url, settings.model_queue) == 1
    assert [e["kind"] for e in store.get_events(run_id)].count("continue") == 1
    record = store.get_record(run_id)
    assert (record.status, record.seq, record.epoch) == (S.QUEUED, 1, held.epoch + 1)


# ---------------------------------------------------------------- the sweeper


def test_a_step_committed_but_never_published_is_published_by_ratchet_sweep(
    db_url: str, redis_url: str, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(db_url, redis_url, publish_grace_seconds=0.2)
    agent = define(settings, tools=[lookup])
    client = Client(settings)
    run_id = client.start(agent.name, input="hello").run_id
    # The first step runs, commits, and cannot publish the next one (the broker went away).
    down = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    engine = StepRunner(build(settings, dispatcher=CeleryDispatcher(down)))
    assert engine.model_step(run_id, 0, owner="test") == "tools"
    record = client.store.get_record(run_id)
    assert (record.status, record.seq, record.next_step) == (S.QUEUED, 1, "tools")

    # When `ratchet sweep` runs once the step is overdue
    wait_until(lambda: time.time() > (record.publish_after or 0), timeout=5, what="the step to be overdue")
    for name, value in settings.model_dump().items():
        if value is not None:
            monkeypatch.setenv(f"RATCHET_{name.upper()}", str(value))
    assert cli.main(["sweep"]) == 0

    # Then a worker (without a sweeper of its own) finishes the run
    with EmbeddedWorker(settings, sweep=False):
        out = client.wait(run_id, timeout=30)
    assert out.status == S.COMPLETED
    assert [m.role for m in out.messages] == ["user", "assistant", "tool", "assistant"]
    assert [r["step"] for r in scripted.requests_for(run_id)] == ["0", "2"]


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


# ---------------------------------------------------------------- at-most-once tools


# ---------------------------------------------------------------- retries


def test_a_rate_limited_call_is_retried_after_its_retry_after_and_then_succeeds(
    settings: Settings, scripted: ScriptedServer
) -> None:
    scripted.configure(ScriptConfig(faults=[Fault(status=429, times=2, retry_after=0.4)]))
    agent = define(settings, retries=3, retry_policy=QUICK_RETRIES)

    with EmbeddedWorker(settings):
        out = agent.run("hello", timeout=30)

    assert out.status == S.COMPLETED
    calls = scripted.requests_for(out.run_id)
    assert [r["status"] for r in calls] == [429, 429, 200]
    assert [r["step"] for r in calls] == ["0", "1", "2"]  # each retry is published as the next seq
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(calls)]
    assert all(g >= 0.4 for g in gaps), gaps
    retries = [e for e in Client(settings).store.get_events(out.run_id) if e["kind"] == "retry"]
    assert [e["detail"]["error"]["type"] for e in retries] == ["RateLimitError", "RateLimitError"]
    assert [e["detail"]["by"] for e in retries] == ["countdown", "countdown"]
    assert all(e["detail"]["delay"] >= 0.4 for e in retries)
