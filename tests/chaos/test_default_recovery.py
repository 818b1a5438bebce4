"""With the default settings (only the database, the broker and the queues set), a run whose
worker is SIGKILLed mid-step runs again on another worker within 30 s: the lease is short, and
the heartbeat keeps it live only while its worker lives."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.settings import Settings
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import CHAOS_SETTINGS, Cluster

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
S = RunStatus
#: Every limit the chaos tests shorten, back to what Ratchet ships with.
DEFAULTS = {name: Settings.model_fields[name].default for name in CHAOS_SETTINGS}


@pytest.mark.parametrize("chaos_db", ["postgres"], indirect=True)
def test_a_run_whose_worker_is_killed_mid_step_runs_again_on_another_worker_within_30_s(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(**DEFAULTS)
    assert cluster.settings.lease_seconds == Settings().lease_seconds
    # Given a tool call in progress on one worker, and a second worker that runs the sweeper's beat
    cluster.script(batches=[calls("a")])
    cluster.flag("hold-a")
    first = cluster.start_worker()
    run_id = cluster.start_run()
    cluster.wait_tool_started("a")
    held = cluster.store.get_record(run_id)
    second = cluster.start_worker(beat=True)

    # When the first worker is SIGKILLed, as the OOM killer or a deploy would
    first.kill()
    killed = time.monotonic()

    # Then the run is RUNNING again, on the other worker, within 30 s
    again = wait_until(
        lambda: (r := cluster.store.get_record(run_id)).status == S.RUNNING and r.epoch > held.epoch and r,
        timeout=30, interval=0.1, what="the run to be claimed again",
    )  # fmt: skip
    took = time.monotonic() - killed
    assert took < 30 and second.alive(), cluster.diagnose([run_id])
    assert again.lease_owner != held.lease_owner

    # And it completes, the interrupted call having run again under the same idempotency key
    cluster.unflag("hold-a")
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == S.COMPLETED
    assert cluster.attempts(run_id) == {"a": 2} and len(cluster.attempted_calls(run_id, "a")) == 1
    assert list(cluster.effects(run_id).values()) == ["a"]
