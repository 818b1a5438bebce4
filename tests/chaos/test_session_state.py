"""A tool batch that changes the session state is killed mid-call and redone: the calls whose
results were committed changed the state once, the killed call's uncommitted change is gone and
it changes the state once when it runs again (on PostgreSQL and SQLite, real worker processes)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.testing.waiting import wait_until
from tests.chaos import agents
from tests.chaos.agents import calls
from tests.chaos.harness import SHORT_LEASE, Cluster, pid_alive

pytestmark = pytest.mark.chaos


def test_a_state_change_of_a_batch_killed_and_redone_is_applied_once_per_call(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(**SHORT_LEASE)
    # Given a batch of three tallies of the session's state, where b waits before it touches it
    cluster.script(batches=[calls("a", "b", "c", name="tally")])
    cluster.flag("hold-b")
    cluster.flag("hold-after-b")
    cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.client.start(
        agents.AGENT, input="tally", session_id="s-tally", user_id="ada", session_state={"count": 0, "tallied": []}
    ).run_id
    wait_until(
        lambda: len(cluster.store.get_output(run_id).tools) == 2, timeout=20, what="a's and c's results to be committed"
    )
    state = cluster.store.session_state("s-tally")
    assert state["count"] == 2 and sorted(state["tallied"]) == ["a", "c"]

    # When b has changed the state (not committed yet) and the process running the batch is killed
    cluster.unflag("hold-b")
    changed = wait_until(lambda: list(cluster.dir.glob("changed-b.*")), timeout=20, what="b to change the state")
    pid = int(changed[0].suffix[1:])
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), timeout=10, what="the pool process to die")
    assert cluster.store.session_state("s-tally")["count"] == 2  # b's change died with it
    cluster.unflag("hold-after-b")

    # Then only b runs again (once the lease expires), and every call changed the state exactly once
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED and out.user_id == "ada"
    assert cluster.attempts(run_id) == {"a": 1, "b": 2, "c": 1}
    assert out.session_state["count"] == 3
    assert sorted(out.session_state["tallied"]) == ["a", "b", "c"]
    assert out.session_state["tallied"][-1] == "b"  # after a's and c's, which were committed before
    session = cluster.client.get_session("s-tally", user_id="ada")
    assert session is not None and session.session_state == out.session_state
    assert [r.run_id for r in session.runs] == [run_id]
