"""Every worker sweeps, one at a time: of two workers that sweep (as every worker does by default),
one holds the fleet's sweep lease and is the only one that acts; when it is SIGKILLed, the other
takes the lease over once it expired, and acts from then on (`orchestrator.sweeping`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest

from orchestrator.store.leases import Lease
from orchestrator.sweeping import SWEEP_LEASE
from orchestrator.testing.waiting import wait_until
from tests.chaos.harness import Cluster, Worker

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
#: Seconds of watching the lease while both workers sweep: several sweep intervals.
WATCH = 6.0
#: A sweep interval (and so a lease of three) long enough that a loaded machine (chaos tests run
#: two at a time) never stalls the holder's thread past its lease.
SWEEP_SECONDS = 1.0


def republished(worker: Worker) -> list[str]:
    """The runs this worker's sweeper published again, in the order of its log."""
    found = re.findall(r"sweep: requeued \[[^\]]*\], republished \[([^\]]*)\]", worker.log())
    return [run_id.strip(" '") for line in found for run_id in line.split(",") if run_id.strip()]


def test_of_two_workers_that_sweep_one_acts_at_a_time_and_the_other_takes_over_when_it_dies(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(sweep_seconds=SWEEP_SECONDS)
    settings = cluster.settings
    store = cluster.store
    # Given two workers that sweep and consume no model calls, so that a run's first step stays
    # unclaimed and every sweeper pass that acts publishes it again (each publish grace)
    control = [settings.tools_queue, settings.control_queue]
    first = cluster.start_worker(sweeps=True, queues=control)
    holder = wait_until(lambda: store.lease(SWEEP_LEASE), timeout=20, what="the first worker to take the sweep lease")
    second = cluster.start_worker(sweeps=True, queues=control)
    assert holder.owner.startswith(first.name)
    run_id = cluster.start_run()

    # When both sweep for many intervals, then the one that holds the lease is SIGKILLed
    seen: list[Lease] = []
    deadline = time.monotonic() + WATCH
    while time.monotonic() < deadline or not republished(first):
        lease = store.lease(SWEEP_LEASE)
        assert lease is not None
        seen.append(lease)
        assert time.monotonic() < deadline + 20, "the holder never published the unclaimed step again"
        time.sleep(0.02)  # a sampling interval of the lease row, not a wait for an outcome
    last = store.lease(SWEEP_LEASE)
    assert last is not None
    first.kill()
    killed = time.time()

    # Then the lease stayed the first's, renewed all along (never expired while it lived), and only
    # the first acted: the second tried the lease and never swept
    assert {lease.owner for lease in seen} == {holder.owner}
    assert len({lease.renewed_at for lease in seen}) >= WATCH / settings.sweep_seconds / 2
    assert run_id in republished(first) and republished(second) == []
    assert "took the sweep lease" not in second.log()

    # And the second takes the lease over once it expired, not before, and acts from then on
    taken = wait_until(
        lambda: (lease := store.lease(SWEEP_LEASE)) is not None and lease.owner.startswith(second.name) and lease,
        timeout=20,
        what="the second worker to take the sweep lease over",
    )
    assert taken.renewed_at >= last.expires_at - 0.01 and taken.renewed_at >= killed
    wait_until(lambda: run_id in republished(second), timeout=20, what="the second worker to sweep")
    assert "took the sweep lease, and sweeps" in second.log()
