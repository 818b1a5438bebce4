"""Workers die mid-step: the run goes on elsewhere, finished work is kept, nothing runs twice
that must not, and a step that kills every worker ends in ERROR instead of looping."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import SHORT_LEASE, Cluster

pytestmark = pytest.mark.chaos


def test_a_pool_process_killed_in_the_middle_of_a_model_call_is_redone_once(cluster: Cluster) -> None:
    # Given a run whose first model call hangs in the model server
    cluster.script(batches=[calls("a")], delay_s=30)
    cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.start_run()
    pid = cluster.wait_model_call(run_id, seq=0)

    # When the pool process making the call is killed (and the model answers at once from now on)
    cluster.script(batches=[calls("a")])
    os.kill(pid, signal.SIGKILL)

    # Then the step runs again once its lease expires, and the run completes with nothing lost
    out = cluster.assert_invariants([run_id], extra_model_calls={0: 1})[run_id]
    assert out.status == RunStatus.COMPLETED
    assert [m.role for m in out.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert cluster.model_calls(run_id)[0] == 2
    assert cluster.attempts(run_id) == {"a": 1}
    # Taken back once its lease expired (by the sweeper, or by the redelivery): a later claim answered
    first, *_ = cluster.answer_epochs(run_id)
    assert first is not None and first >= 2


def test_a_worker_killed_in_the_middle_of_a_tool_batch_reruns_only_the_unfinished_call(cluster: Cluster) -> None:
    # Given a batch of three calls where b holds while a and c finish
    cluster.script(batches=[calls("a", "b", "c")])
    cluster.flag("hold-b")
    first = cluster.start_worker()
    run_id = cluster.start_run()
    cluster.wait_tool_started("b")
    wait_until(
        lambda: len(cluster.store.get_output(run_id).tools) == 2, timeout=20, what="a's and c's results to be committed"
    )

    # When the whole worker is killed, and another one starts (with the sweeper's beat)
    first.kill()
    cluster.unflag("hold-b")
    cluster.start_worker(beat=True)

    # Then only b runs again; a and c took effect once, as their stored results say
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED
    assert cluster.attempts(run_id) == {"a": 1, "b": 2, "c": 1}
    assert len(cluster.attempted_calls(run_id, "b")) == 1  # both runs of b had the same idempotency key
    assert sorted(cluster.effects(run_id).values()) == ["a", "b", "c"]
    assert sorted(t.result for t in out.tools) == ["a: applied", "b: applied", "c: applied"]


def test_a_step_that_kills_its_worker_every_time_errors_after_the_attempt_cap(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(max_step_attempts=2, **SHORT_LEASE)
    cluster.script(batches=[calls("x", name="crash")])
    cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.start_run()

    out = cluster.assert_invariants([run_id])[run_id]

    assert out.status == RunStatus.ERROR
    assert out.error is not None and out.error.type == "PoisonStepError"
    assert "claimed 2 times and never finished" in out.error.message
    assert len(list(cluster.dir.glob("started-x.*"))) == 2
    # The conversation up to the poison step is kept.
    assert [m.role for m in out.messages] == ["system", "user", "assistant"]


def test_an_at_most_once_tool_cut_off_by_a_dead_worker_is_not_run_again_and_the_run_errors(cluster: Cluster) -> None:
    # Given a batch where an at-most-once call holds while an ordinary one finishes
    cluster.script(batches=[calls("a") + calls("b", name="effect_once")])
    cluster.flag("hold-b")
    first = cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.start_run()
    cluster.wait_tool_started("b")
    wait_until(lambda: len(cluster.store.get_output(run_id).tools) == 1, timeout=20, what="a's result to be committed")

    # When the worker dies and another takes the step over
    first.kill()
    cluster.unflag("hold-b")
    cluster.start_worker()

    # Then b is not run again: the run stops in ERROR, saying so
    out = cluster.wait_status(run_id, RunStatus.ERROR, timeout=30)
    assert out.error is not None and out.error.type == "ToolInterruptedError"
    assert "at-most-once tool call effect_once" in out.error.message and "not run again" in out.error.message
    assert cluster.attempts(run_id) == {"a": 1, "b": 1}

    # And continuing it tells the model the outcome is unknown, without running b
    cluster.client.continue_run(run_id)
    done = cluster.assert_invariants([run_id])[run_id]
    assert done.status == RunStatus.COMPLETED
    assert cluster.attempts(run_id) == {"a": 1, "b": 1}
    b_result = next(t for t in done.tools if t.tool_name == "effect_once")
    assert b_result.tool_call_error and "outcome is unknown" in (b_result.result or "")
