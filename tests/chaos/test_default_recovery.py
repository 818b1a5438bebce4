"""With the default settings (only the database, the broker and the queues set) and no process
but the workers (no beat), a run whose worker is SIGKILLed mid-step runs again on another worker
within a lease, a sweep interval and a margin: the lease is short, the heartbeat keeps it live
only while its worker lives, every worker sweeps (the killed one held the sweep lease, which
expires with its step's), and the sweeper that takes the run back publishes its step at once
rather than leaving it to the republish of unclaimed steps (RATCHET_PUBLISH_GRACE_SECONDS later, a
minute by default)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.settings import Settings
from orchestrator.sweeping import SWEEP_LEASE, lease_seconds
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import CHAOS_SETTINGS, Cluster

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
S = RunStatus
#: Every limit the chaos tests shorten, back to what Ratchet ships with.
DEFAULTS = {name: Settings.model_fields[name].default for name in CHAOS_SETTINGS}
#: Beyond a lease and a sweep interval: the sweep, the claim of the step it publishes, and a loaded
#: machine (chaos tests run two at a time). Well under the publish grace, so a sweeper that did
#: not publish cannot pass.
MARGIN = 10.0


def test_a_run_whose_worker_is_killed_mid_step_runs_again_within_a_lease_a_sweep_and_a_margin(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(**DEFAULTS)
    settings = cluster.settings
    assert (settings.lease_seconds, settings.sweep_seconds) == (Settings().lease_seconds, Settings().sweep_seconds)
    assert lease_seconds(settings) <= settings.lease_seconds and Settings().worker_sweeps
    bound = settings.lease_seconds + settings.sweep_seconds + MARGIN
    assert bound < settings.publish_grace_seconds
    # Given a tool call in progress on one worker, which also holds the sweep lease, and a second
    # worker: both sweep, as every worker does by default, and no beat runs
    cluster.script(batches=[calls("a")])
    cluster.flag("hold-a")
    first = cluster.start_worker(sweeps=True)
    run_id = cluster.start_run()
    cluster.wait_tool_started("a")
    held = cluster.store.get_record(run_id)
    second = cluster.start_worker(sweeps=True)
    wait_until(
        lambda: (lease := cluster.store.lease(SWEEP_LEASE)) is not None and lease.owner.startswith(first.name),
        timeout=2 * settings.sweep_seconds + MARGIN, what="the first worker to take the sweep lease",
    )  # fmt: skip

    # When the first worker is SIGKILLed, as the OOM killer or a deploy would
    first.kill()
    killed = time.monotonic()

    # Then the other worker's sweeper takes the sweep lease over and the run back, and the run is
    # RUNNING again, on the other worker, within the bound (its lease and the sweep lease ran out
    # at most a lease after the kill, a sweep found it within an interval of that)
    again = wait_until(
        lambda: (r := cluster.store.get_record(run_id)).status == S.RUNNING and r.epoch > held.epoch and r,
        timeout=bound, interval=0.1, what=f"the run to be claimed again within {bound:g} s of the kill",
    )  # fmt: skip
    took = time.monotonic() - killed
    assert took < bound and second.alive(), cluster.diagnose([run_id])
    assert again.lease_owner != held.lease_owner
    assert "lease_expired" in cluster.events(run_id)

    # And it completes, the interrupted call having run again under the same idempotency key
    cluster.unflag("hold-a")
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == S.COMPLETED
    assert cluster.attempts(run_id) == {"a": 2} and len(cluster.attempted_calls(run_id, "a")) == 1
    assert list(cluster.effects(run_id).values()) == ["a"]
