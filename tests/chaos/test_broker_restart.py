"""Redis restarts while runs are in flight: it comes back empty (no persistence), so queued
and unacknowledged messages are gone. Workers reconnect; the sweeper republishes the runs whose
step nobody took and re-queues those whose worker lost its step; every run completes."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import SHORT_LEASE, Cluster

pytestmark = pytest.mark.chaos


def test_runs_in_flight_complete_after_redis_restarts_empty(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(**SHORT_LEASE)
    cluster.script(batches=[calls("a")], delay_s=0.3)
    cluster.start_worker()
    cluster.start_sweeper()
    run_ids = [cluster.start_run(f"run {i}") for i in range(6)]
    # Some steps are running, others wait in Redis.
    wait_until(lambda: len(cluster.model.requests) >= 2, timeout=20, what="two model calls in flight or done")

    cluster.redis.restart()

    # A step cut short by the restart may call the model once more.
    outs = cluster.assert_invariants(run_ids, extra_model_calls=1, timeout=60)
    assert {o.status for o in outs.values()} == {RunStatus.COMPLETED}
    for run_id in run_ids:  # a tool cut short may have started twice; it took effect once
        assert list(cluster.effects(run_id).values()) == ["a"]
