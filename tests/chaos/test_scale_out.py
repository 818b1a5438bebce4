"""Scale-out (#13 point 5): three worker processes, two on the model queue and one on tools and
control, run 300 concurrent runs of several tool batches each. One model worker is stopped the
way a deploy stops it (warm shutdown, SIGTERM) and the other is killed (SIGKILL) mid-load; a new
model worker takes over. Every run completes exactly once and no tool call takes effect twice.

On PostgreSQL only: workers on several hosts share a server database; SQLite is the one-host
embedded default, and its one writer at a time is what many processes contend for (on one SQLite
file, a lease scaled to the test was lost to a heartbeat starved by the write lock, and a tool ran
again).
The lease and heartbeat keep the defaults' proportions (15 s and 3 s) at a test's scale: a lease
a heartbeat cannot renew in time is lost while its worker lives, and its tool calls may run
again (docs/guarantees.md, "When a tool can run again", case 3)."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import Cluster

pytestmark = pytest.mark.chaos
S = RunStatus
RUNS = 300
#: Three tool batches, four calls: seven steps a run, 2,100 in all.
BATCHES = [calls("a"), calls("b", "c"), calls("d")]


@pytest.mark.parametrize("chaos_db", ["postgres"], indirect=True)
def test_300_runs_on_three_workers_complete_once_through_a_warm_shutdown_and_a_kill(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        lease_seconds=6.0, heartbeat_seconds=1.0, soft_time_limit=10.0, hard_time_limit=12.0, visibility_timeout=30.0
    )
    settings = cluster.settings
    # Each model call takes 20 ms at the model, so steps are in flight when the workers go.
    cluster.script(batches=BATCHES, delay_s=0.02)
    model_1 = cluster.start_worker(queues=[settings.model_queue], pool="threads", concurrency=8)
    model_2 = cluster.start_worker(queues=[settings.model_queue], pool="threads", concurrency=8)
    cluster.start_worker(queues=[settings.tools_queue, settings.control_queue], pool="threads", concurrency=8)
    cluster.start_sweeper()
    run_ids = [cluster.start_run(f"run {i}") for i in range(RUNS)]

    def completed() -> int:
        return sum(cluster.store.get_record(r).status == S.COMPLETED for r in run_ids)

    # When one model worker is stopped as a deploy stops it, with runs in flight
    wait_until(lambda: completed() >= RUNS // 10, timeout=120, what="a tenth of the runs to complete")
    model_1.proc.send_signal(signal.SIGTERM)
    assert model_1.proc.wait(60) == 0, model_1.log()[-3000:]  # it finished what it held, then exited
    # and the other is killed outright, and a new one starts
    wait_until(lambda: completed() >= RUNS // 3, timeout=120, what="a third of the runs to complete")
    model_2.kill()
    cluster.start_worker(queues=[settings.model_queue], pool="threads", concurrency=8)

    # Then every run completes, each step's model call made at most twice (a killed call again),
    # and every tool call took effect exactly once
    outputs = cluster.wait_final(run_ids, timeout=240)
    for run_id in run_ids:
        try:
            cluster.assert_invariants([run_id], extra_model_calls=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{cluster.diagnose([run_id])}") from None
    assert Counter(out.status for out in outputs.values()) == {S.COMPLETED: RUNS}
    for run_id, out in outputs.items():
        assert [m.role for m in out.messages].count("tool") == 4, run_id
        assert sorted(cluster.effects(run_id).values()) == ["a", "b", "c", "d"], run_id
        assert out.seq == 7, (run_id, out.seq)
