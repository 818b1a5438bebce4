"""At-least-once delivery meets the database: a worker that wakes after its lease is fenced,
duplicate deliveries of a step run it once, and a step committed but never published (the
process died in between) is published by the sweeper."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from orchestrator import RunStatus
from orchestrator.ports import StepRef
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import Cluster, pid_alive

pytestmark = pytest.mark.chaos


def test_a_worker_frozen_past_its_lease_is_fenced_when_it_wakes(cluster: Cluster) -> None:
    # Given a worker in the middle of the first model call (held at the model until it froze).
    # One pool process: with a free slot its main process would also be waiting for messages.
    cluster.script(batches=[calls("a")])
    cluster.model.holding.hold()
    frozen = cluster.start_worker(concurrency=1)
    cluster.start_sweeper()
    run_id = cluster.start_run()
    pid = cluster.wait_model_call(run_id, seq=0)

    # When the whole worker freezes (the model's answer then waits in its socket), and another
    # one finishes the run after the lease expired
    frozen.signal_all(signal.SIGSTOP)
    cluster.model.holding.release()
    cluster.start_worker()
    done = cluster.wait_final([run_id])[run_id]
    assert done.status == RunStatus.COMPLETED

    # And the frozen pool process wakes first (its main process, still frozen, cannot enforce
    # the time limit), reads the model's answer, and tries to commit it
    os.kill(pid, signal.SIGCONT)
    wait_until(lambda: "fenced" in cluster.events(run_id), timeout=20, what="the woken worker's commit to be fenced")
    frozen.signal_all(signal.SIGCONT)

    # Then its commit was rolled back: the run is exactly as the other worker left it
    out = cluster.assert_invariants([run_id], extra_model_calls={0: 1})[run_id]
    assert out.messages == done.messages and out.status == RunStatus.COMPLETED
    fenced = next(e for e in cluster.store.get_events(run_id) if e["kind"] == "fenced")
    assert fenced["seq"] == 0 and fenced["detail"]["epoch"] == 1
    assert cluster.attempts(run_id) == {"a": 1}


def test_every_step_delivered_twice_at_once_runs_once(cluster: Cluster) -> None:
    # Given workers that publish every step twice, and a first step sent twice as well
    cluster.script(batches=[calls("a", "b")], delay_s=0.2)
    cluster.flag("publish-twice")
    workers = [cluster.start_worker(), cluster.start_worker()]
    run_id = cluster.start_run()
    cluster.dispatcher.publish(StepRef(run_id=run_id, seq=0, kind="model"))

    out = cluster.assert_invariants([run_id])[run_id]

    # Then each step ran once: one model call per step, each tool once
    assert out.status == RunStatus.COMPLETED
    assert cluster.model_calls(run_id) == {0: 1, 2: 1}
    assert cluster.attempts(run_id) == {"a": 1, "b": 1}
    # ...and each of the three steps' second delivery was dropped by the claim.
    wait_until(
        lambda: sum(w.log().count("'dropped'") for w in workers) == 3,
        timeout=20, what="three duplicate deliveries to be dropped",
    )  # fmt: skip


def test_a_process_that_dies_between_a_commit_and_its_publish_is_caught_up_by_the_sweeper(cluster: Cluster) -> None:
    # Given a worker whose pool process dies right after it commits the first step, before it
    # publishes the next one; the sweeper runs as the beat task of that same worker
    cluster.script(batches=[calls("a")])
    run_id = str(uuid.uuid4())
    cluster.flag(f"crash-before-publish-{run_id}")
    cluster.start_worker(beat=True)

    cluster.start_run(run_id=run_id)

    # Then the committed step is found and published, and the run completes, each step once
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED
    assert (cluster.dir / f"crash-before-publish-{run_id}.taken").exists()
    assert cluster.model_calls(run_id) == {0: 1, 2: 1}
    assert cluster.attempts(run_id) == {"a": 1}
    [marker] = cluster.dir.glob(f"model-{run_id}-0.*")
    assert not pid_alive(int(marker.suffix[1:])), "the process that committed step 0 should have died"
