"""Time limits on real prefork workers (the threads pool has none): soft 2 s < hard 3 s <
lease 4 s < visibility timeout 10 s (`TIME_LIMITS`). A step past its soft limit fails with its
messages flushed; one killed at the hard limit is taken back by the sweeper when its lease expires."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import TIME_LIMITS, Cluster, pid_alive

pytestmark = pytest.mark.chaos


def test_a_model_call_past_the_soft_limit_errors_with_the_conversation_flushed(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(**TIME_LIMITS)
    cluster.script(batches=[calls("a")], delay_s=30)
    cluster.start_worker()
    run_id = cluster.start_run()

    out = cluster.wait_status(run_id, RunStatus.ERROR, timeout=20)

    # Not mistaken for a connection error and retried: the step's time is up.
    assert out.error is not None and out.error.type == "StepTimeoutError"
    assert "soft time limit (2s)" in out.error.message and "RATCHET_SOFT_TIME_LIMIT" in out.error.message
    assert [(m.role, m.content) for m in out.messages] == [("system", "Do what the script says."), ("user", "hello")]
    assert cluster.model_calls(run_id) == {0: 1}
    cluster.assert_invariants([run_id])


def test_a_tool_batch_past_the_soft_limit_waits_for_its_running_tools_and_keeps_every_result(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Given a batch where a finishes and b is still running at the soft limit (the hard limit far off)
    cluster = make_cluster(soft_time_limit=2.0, hard_time_limit=30.0, lease_seconds=31.0, visibility_timeout=60.0)
    cluster.script(batches=[calls("a", "b")])
    cluster.flag("hold-b")
    worker = cluster.start_worker()
    run_id = cluster.start_run()

    # When the soft limit ends the step while b runs, and b then finishes
    wait_until(
        lambda: "still running; waiting for them" in worker.log(), timeout=20, what="the soft limit to find b running"
    )
    cluster.unflag("hold-b")
    failed = cluster.wait_status(run_id, RunStatus.ERROR, timeout=20)

    # Then the step failed as timed out, not as a tool error, and b's result was kept, not dropped
    assert failed.error is not None and failed.error.type == "StepTimeoutError"
    assert sorted((t.tool_args or {}).get("key") for t in failed.tools) == ["a", "b"]
    assert all(t.result == f"{(t.tool_args or {})['key']}: applied" for t in failed.tools)

    # And a continue runs no tool again: each took effect once
    cluster.client.continue_run(run_id)
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED and out.messages[: len(failed.messages)] == failed.messages
    assert cluster.attempts(run_id) == {"a": 1, "b": 1}
    assert sorted(cluster.effects(run_id).values()) == ["a", "b"]


def test_a_single_tool_past_the_soft_limit_is_not_mistaken_for_a_tool_error(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(**TIME_LIMITS)
    # A lone call runs in the task's own thread, where the soft limit is raised inside the tool.
    cluster.script(batches=[calls("a")])
    cluster.flag("hold-a")
    cluster.start_worker()
    run_id = cluster.start_run()

    out = cluster.wait_status(run_id, RunStatus.ERROR, timeout=20)

    assert out.error is not None and out.error.type == "StepTimeoutError"
    assert out.tools == [] and [m.role for m in out.messages] == ["system", "user", "assistant"]
    cluster.assert_invariants([run_id])


def test_an_async_tool_past_the_soft_limit_is_cancelled_and_runs_again_on_continue(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(**TIME_LIMITS)
    # Given an async tool awaiting on its worker process's tool loop when the soft limit strikes
    cluster.script(batches=[calls("a", name="effect_async")])
    cluster.flag("hold-a")
    cluster.start_worker()
    run_id = cluster.start_run()

    # Then the step times out with no result for the call
    out = cluster.wait_status(run_id, RunStatus.ERROR, timeout=20)
    assert out.error is not None and out.error.type == "StepTimeoutError"
    assert out.tools == []

    # And a continue runs it again to the end; the cancelled first call never took effect (one row)
    cluster.unflag("hold-a")
    cluster.client.continue_run(run_id)
    done = cluster.assert_invariants([run_id])[run_id]
    assert done.status == RunStatus.COMPLETED
    assert [t.result for t in done.tools] == ["a: applied"]
    assert cluster.attempts(run_id) == {"a": 2}
    assert sorted(cluster.effects(run_id).values()) == ["a"]


def test_a_step_killed_at_the_hard_limit_is_recovered_by_the_sweeper(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(**TIME_LIMITS)
    # Given a tool that ignores the soft limit and holds until the hard limit kills it
    cluster.script(batches=[calls("a")])
    cluster.flag("hold-a")
    cluster.flag("stubborn-a")
    worker = cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.start_run()
    pid = cluster.wait_tool_started("a")
    wait_until(lambda: not pid_alive(pid), timeout=10, what="the hard time limit to kill the pool process")
    cluster.unflag("hold-a")

    # Then the sweeper re-queues the step when its lease expires, and it runs again to the end
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED
    assert cluster.attempts(run_id) == {"a": 2}
    assert "lease_expired" in cluster.events(run_id)
    assert "Hard time limit (3.0s) exceeded" in worker.log()
    assert "killed at the hard time limit; the sweeper will retry it" in worker.log()
