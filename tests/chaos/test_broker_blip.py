"""A broker blip while a step runs: the worker loses its Redis connections and reconnects, and
the step in flight goes on as if nothing happened (its writes go to the database, not the
broker; a redelivered copy of its message is dropped by the claim)."""

from __future__ import annotations

import pytest

from orchestrator import RunStatus
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import Cluster, pid_alive

pytestmark = pytest.mark.chaos


def test_a_step_in_flight_survives_a_redis_blip_and_its_tool_runs_once(cluster: Cluster) -> None:
    # Given a worker in the middle of a tool call
    cluster.script(batches=[calls("a")])
    cluster.flag("hold-a")
    worker = cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.start_run()
    pid = cluster.wait_tool_started("a")

    # When Redis drops every client connection (a network blip), and the worker notices
    assert cluster.redis.client().client_kill_filter(_type="normal") >= 1
    wait_until(lambda: "Connection to broker lost" in worker.log(), timeout=20, what="the worker to see the blip")
    cluster.unflag("hold-a")

    # Then the step was not interrupted: the tool ran once, in the same process, and the run completed
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED
    assert cluster.attempts(run_id) == {"a": 1}
    assert list(cluster.effects(run_id).values()) == ["a"]
    assert pid_alive(pid)
    assert "lease_expired" not in cluster.events(run_id)
