"""The two Agno failures Ratchet exists to beat (docs/coming-from-agno.md):

1. Agno loses the run and the user's message when the process dies before the first
   checkpoint. Ratchet writes both before anything is published.
2. Agno re-runs tools on retry. Ratchet stores each tool result when it finishes, and a
   retry (here: continue after an ERROR) runs only what is owed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import select

from orchestrator import RunStatus
from orchestrator.store.tables import runs
from orchestrator.testing.script import Fault
from tests.chaos.agents import AGENT, calls
from tests.chaos.harness import Cluster

pytestmark = pytest.mark.chaos


def test_a_producer_killed_before_the_first_step_leaves_the_run_and_its_message_and_the_run_completes(
    cluster: Cluster,
) -> None:
    # Given `ratchet run` dying as it publishes the first step
    cluster.script(batches=[calls("a")])
    producer = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", AGENT, "remember me", "--app", "tests.chaos.agents"],
        env=cluster.env(RATCHET_DISPATCHER="tests.chaos.agents:DyingDispatcher"),
        cwd=cluster.root, capture_output=True, timeout=60,
    )  # fmt: skip
    assert producer.returncode == 3, producer.stderr.decode()

    # Then the run and the user's message are stored, waiting
    with cluster.store.engine.connect() as conn:
        [run_id] = conn.execute(select(runs.c.run_id)).scalars()
    waiting = cluster.store.get_output(run_id)
    assert waiting.status == RunStatus.QUEUED
    assert [(m.role, m.content) for m in waiting.messages] == [("user", "remember me")]

    # When workers and the sweeper come up, the run is published and completes
    cluster.start_worker()
    cluster.start_sweeper()
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED
    assert [(m.role, m.content) for m in out.messages][:2] == [
        ("system", "Do what the script says."),
        ("user", "remember me"),
    ]


def test_a_retry_never_reruns_a_tool_whose_result_is_stored(cluster: Cluster) -> None:
    # Given a run whose tools ran, then whose next model call failed for good
    cluster.script(batches=[calls("a", "b")], faults=[Fault(turn=2, status=500, times=None)])
    cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.start_run()
    failed = cluster.wait_final([run_id])[run_id]
    assert failed.status == RunStatus.ERROR and len(failed.tools) == 2
    assert cluster.attempts(run_id) == {"a": 1, "b": 1}

    # When the model is back and the run is continued
    cluster.script(batches=[calls("a", "b")])
    cluster.client.continue_run(run_id)

    # Then the same run completes without running a or b again
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED and out.run_id == run_id
    assert out.messages[: len(failed.messages)] == failed.messages
    assert cluster.attempts(run_id) == {"a": 1, "b": 1}
    assert sorted(cluster.effects(run_id).values()) == ["a", "b"]
