"""Starts racing for the last places under a bound on QUEUED runs, on PostgreSQL and SQLite: they
are counted one at a time, so they never together take an agent past its `max_queued`. On
PostgreSQL a start waits for the lock of the start counting before it and then sees its run,
shown with a start held mid-write by a row lock the test holds; on both databases, starts sent
at once by threads get exactly the places left. One process's view: tests/unit/test_queue_bounds_inline.py."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text

from orchestrator import Agent, QueueFullError
from orchestrator.idempotency import StartRequest
from orchestrator.settings import Settings
from orchestrator.starting import write
from orchestrator.store import Store
from orchestrator.store.backlog import Bound
from orchestrator.testing.waiting import wait_until
from tests.support import CountingModel

Outcome = str | QueueFullError


def start(
    store: Store, settings: Settings, agent: str, *, session: str | None = None, user: str | None = None
) -> Outcome:
    """A start's write, as every producer's: the run's id, or the refusal."""
    request = StartRequest.checked(
        agent=agent, input="hi", session_id=session, user_id=user, stream=False, priority=None, session_state=None
    )
    run_id = str(uuid.uuid4())
    try:
        write(store, settings, request, run_id)
    except QueueFullError as exc:
        return exc
    return run_id


def queued(store: Store, agent: str) -> int:
    return store.backlog.queued(Bound(scope="agent", key=agent, limit=1000, named="a test"))


def waiting_for_locks(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar_one())


def test_on_postgresql_a_start_waits_for_the_start_counting_before_it_and_sees_its_run(pg_url: str) -> None:
    settings, store = Settings(database_url=pg_url), Store.open(pg_url)
    agent = Agent(name=f"race-{uuid.uuid4().hex[:8]}", model=CountingModel(), max_queued=2)
    other = Agent(name=f"other-{uuid.uuid4().hex[:8]}", model=CountingModel())
    assert isinstance(start(store, settings, agent.name), str)  # one place of two taken
    held_session = f"held-{uuid.uuid4().hex[:8]}"
    assert isinstance(start(store, settings, other.name, session=held_session), str)  # not counted: another agent
    results: dict[str, Outcome] = {}

    # Given a start that counted (1 QUEUED) and then waits, mid-write, on its session's row
    with store.engine.connect() as blocker:
        held = blocker.begin()
        blocker.execute(text("SELECT 1 FROM ratchet_sessions WHERE session_id = :s FOR UPDATE"), {"s": held_session})
        first = threading.Thread(
            target=lambda: results.update(first=start(store, settings, agent.name, session=held_session))
        )
        first.start()
        wait_until(lambda: waiting_for_locks(store) >= 1, timeout=30, what="the first start to wait on the session row")
        # When another start comes for the last place meanwhile
        second = threading.Thread(target=lambda: results.update(second=start(store, settings, agent.name)))
        second.start()
        wait_until(
            lambda: waiting_for_locks(store) >= 2 or "second" in results,
            timeout=30,
            what="the second start to wait for the first (or, unlocked, to be written)",
        )
        held.rollback()
    first.join(30)
    second.join(30)

    # Then the second counted after the first committed, and was refused
    assert isinstance(results["first"], str)
    refused = results["second"]
    assert isinstance(refused, QueueFullError) and (refused.queued, refused.limit) == (2, 2)
    assert queued(store, agent.name) == 2


@pytest.mark.parametrize("scope", ["agent", "user"])
def test_starts_sent_at_once_get_exactly_the_places_left(db_url: str, scope: str) -> None:
    limit, starts = 3, 8
    bounds = {"max_queued_per_user": limit} if scope == "user" else {}
    settings = Settings(database_url=db_url, **bounds)
    store = Store.open(db_url)
    agent = Agent(
        name=f"race-{uuid.uuid4().hex[:8]}", model=CountingModel(), max_queued=limit if scope == "agent" else None
    )
    user = f"user-{uuid.uuid4().hex[:6]}" if scope == "user" else None
    gate = threading.Barrier(starts)
    results: list[Outcome] = []
    lock = threading.Lock()

    def one() -> None:
        gate.wait(30)
        outcome = start(store, settings, agent.name, user=user)
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=one) for _ in range(starts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    written = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, QueueFullError)]
    assert (len(written), len(refused)) == (limit, starts - limit)
    assert {r.scope for r in refused} == {scope} and queued(store, agent.name) == limit
