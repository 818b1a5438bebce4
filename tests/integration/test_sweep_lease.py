"""The fleet's sweep lease (`ratchet_leases`, `Store.hold_lease`): one holder at a time, renewed
by its holder, taken over once it expires, let go at once by a holder that stops; and what
`ratchet health --check sweeper` reads of it. On SQLite and PostgreSQL."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import pytest

from orchestrator.runtime import build
from orchestrator.store import Store
from orchestrator.sweeping import SWEEP_LEASE, FleetSweeper
from tests.conftest import make_settings
from tests.support import Clock
from workers.celery.dispatch import CeleryDispatcher
from workers.celery.tasks import StepRunner
from workers.health import check_health


@pytest.fixture
def store(db_url: str, clock: Clock) -> Store:
    return Store(Store.open(db_url).engine, clock=clock)


def test_one_holder_at_a_time_renewed_by_it_and_taken_over_once_it_expires(store: Store, clock: Clock) -> None:
    # Given a lease nobody ever took: the first taker gets it, and nobody else while it lives
    assert store.lease(SWEEP_LEASE) is None
    assert store.hold_lease(SWEEP_LEASE, "a", seconds=10)
    assert not store.hold_lease(SWEEP_LEASE, "b", seconds=10)
    taken = store.lease(SWEEP_LEASE)
    assert taken is not None and taken.owner == "a" and taken.held(clock())

    # When its holder renews it, it lasts from then on
    clock.advance(8)
    assert store.hold_lease(SWEEP_LEASE, "a", seconds=10)
    clock.advance(8)
    assert not store.hold_lease(SWEEP_LEASE, "b", seconds=10)

    # Then once it expires, another takes it over, and the old holder cannot renew it
    clock.advance(3)
    assert store.hold_lease(SWEEP_LEASE, "b", seconds=10)
    assert not store.hold_lease(SWEEP_LEASE, "a", seconds=10)
    lease = store.lease(SWEEP_LEASE)
    assert lease is not None and lease.owner == "b" and lease.renewed_at == pytest.approx(clock(), abs=1)


def test_a_holder_that_lets_go_leaves_the_lease_to_the_next_at_once_and_only_its_own(store: Store) -> None:
    assert store.hold_lease(SWEEP_LEASE, "a", seconds=60)
    assert not store.hold_lease(SWEEP_LEASE, "b", seconds=0)  # not b's to let go
    assert not store.hold_lease(SWEEP_LEASE, "b", seconds=60)
    assert not store.hold_lease(SWEEP_LEASE, "a", seconds=0)  # let go: it holds nothing now
    assert store.hold_lease(SWEEP_LEASE, "b", seconds=60)
    lease = store.lease(SWEEP_LEASE)
    assert lease is not None and lease.owner == "b"


def test_of_many_takers_at_once_exactly_one_gets_the_lease(store: Store) -> None:
    gate = threading.Barrier(8)
    got: list[str] = []

    def take(owner: str) -> None:
        gate.wait()
        if store.hold_lease("race", owner, seconds=60):
            got.append(owner)

    threads = [threading.Thread(target=take, args=(f"t{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    lease = store.lease("race")
    assert lease is not None and got == [lease.owner]


@pytest.fixture
def runner(db_url: str, redis_url: str, store: Store) -> Iterator[StepRunner]:
    settings = make_settings(db_url, redis_url)
    runner = StepRunner(build(settings, store=store, dispatcher=CeleryDispatcher(settings)))
    yield runner
    runner.dispatcher.app.close()  # type: ignore[attr-defined]


def test_a_fleet_sweeper_sweeps_only_while_it_holds_the_lease(runner: StepRunner, clock: Clock) -> None:
    first, second = FleetSweeper(runner, "first"), FleetSweeper(runner, "second")
    assert first.sweep() is not None and first.holding
    assert second.sweep() is None and not second.holding
    clock.advance(first.seconds + 1)  # the first stopped renewing: its lease ran out
    assert second.sweep() is not None and second.holding
    assert first.sweep() is None and not first.holding
    second.release()
    assert first.sweep() is not None


def test_the_sweeper_check_passes_on_a_recent_sweep_and_fails_on_none_or_a_stale_one(
    db_url: str, redis_url: str, store: Store, clock: Clock
) -> None:
    settings = make_settings(db_url, redis_url)
    (check,) = check_health(settings, checks=["sweeper"]).checks
    assert not check.ok and check.detail.startswith("no sweeper has run on this database: start a worker")

    store.hold_lease(SWEEP_LEASE, "w1@host:12:ab", seconds=60)
    (check,) = check_health(settings, checks=["sweeper"]).checks
    assert check.ok and check.detail.startswith("swept 0.") and check.detail.endswith("ago by w1@host:12:ab")
    assert check.info["held"] is True and check.info["owner"] == "w1@host:12:ab"

    clock.advance(-120)  # a lease last renewed two minutes ago, by a sweeper that stopped
    store.hold_lease(SWEEP_LEASE, "w1@host:12:ab", seconds=0)
    (check,) = check_health(settings, checks=["sweeper"], max_age=60).checks
    assert not check.ok and re.match(r"the sweeper last ran 1[2-9]\ds ago \(more than 60s; it runs every", check.detail)
    assert check.info["held"] is False
