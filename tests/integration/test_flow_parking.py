"""A step parked by flow control, in the store on both databases: QUEUED again at the same seq,
no retry spent, its claim not counted toward the poison limit, its outbox marker set for when
it is due, a "throttled" entry in the run's log, and nothing written by a claim it lost."""

from __future__ import annotations

import pytest

from orchestrator import RunStatus
from orchestrator.errors import FencedError
from orchestrator.settings import Settings
from orchestrator.store import Claim, Store
from tests.support import Clock, clocked_store, new_run

S = RunStatus


@pytest.fixture
def store(settings: Settings, clock: Clock) -> Store:
    return clocked_store(settings, clock)


def claim(store: Store, run_id: str, owner: str = "w1") -> Claim | None:
    return store.claim(run_id, 0, "model", owner=owner, lease_seconds=30.0, max_attempts=3)


def test_a_step_parked_again_and_again_keeps_its_seq_and_spends_no_retry_and_no_attempt(
    store: Store, clock: Clock
) -> None:
    run_id = new_run(store)
    for n in range(5):  # more parks than the poison limit of 3 claims
        held = claim(store, run_id, owner=f"w{n}")
        assert held is not None, f"claim {n + 1} refused"
        parked = store.park_throttled(held, delay=2.0, published=n % 2 == 0, reason="requests", publish_grace=60)
        assert (parked.status, parked.seq, parked.retries, parked.attempts) == (S.QUEUED, 0, 0, 0)
        assert parked.epoch == held.epoch and parked.lease_owner is None
        # The marker: published with a countdown, the sweeper steps in after the grace; else when due.
        grace = 60 if n % 2 == 0 else 0
        assert parked.publish_after == pytest.approx(clock() + 2.0 + grace, abs=1)
    log = [e for e in store.get_log(run_id) if e.kind == "throttled"]
    assert len(log) == 5 and {e.seq for e in log} == {0}
    assert log[0].detail["reason"] == "requests" and log[0].detail["delay"] == 2.0
    assert [e.detail["by"] for e in log] == ["countdown", "sweeper"] * 2 + ["countdown"]
    assert store.get_output(run_id).retry is None


def test_a_park_by_a_claim_that_was_lost_writes_nothing(store: Store, clock: Clock) -> None:
    run_id = new_run(store)
    old = claim(store, run_id, owner="old")
    assert old is not None
    clock.advance(31)
    new = claim(store, run_id, owner="new")
    assert new is not None
    with pytest.raises(FencedError):
        store.park_throttled(old, delay=1.0, published=True, reason="concurrency", publish_grace=60)
    record = store.get_record(run_id)
    assert (record.status, record.epoch, record.lease_owner, record.attempts) == (S.RUNNING, new.epoch, "new", 2)
    assert not [e for e in store.get_log(run_id) if e.kind == "throttled"]
