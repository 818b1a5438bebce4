"""A model that fails: transient errors are retried after Retry-After, persistent ones end the
run in ERROR after the agent's retries, with the conversation kept; a model that fails for good
hands the step to its fallback, and a worker killed in the fallback's call resumes on it."""

from __future__ import annotations

import itertools
import os
import signal

import pytest

from orchestrator import RunStatus
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import FALLBACK_AGENT, calls
from tests.chaos.harness import Cluster

pytestmark = pytest.mark.chaos


def test_a_model_that_answers_429_twice_then_succeeds_completes_the_run(cluster: Cluster) -> None:
    cluster.script(batches=[calls("a")], faults=[Fault(turn=1, status=429, times=2, retry_after=0.5)])
    cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.start_run()

    # A retry is published as the next seq, so even here each step calls the model once.
    out = cluster.assert_invariants([run_id])[run_id]

    assert out.status == RunStatus.COMPLETED
    first_turn = [r for r in cluster.model.requests_for(run_id) if r["turn"] == 1]
    assert [(r["step"], r["status"]) for r in first_turn] == [("0", 429), ("1", 429), ("2", 200)]
    assert all(b["at"] - a["at"] >= 0.5 for a, b in itertools.pairwise(first_turn))
    assert cluster.events(run_id) == ["retry", "retry", "completed"]
    assert cluster.attempts(run_id) == {"a": 1}


def test_a_model_that_answers_500_forever_ends_in_error_after_the_agents_retries(cluster: Cluster) -> None:
    cluster.script(batches=[calls("a")], faults=[Fault(status=500, times=None, message="overloaded")])
    cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.start_run()

    out = cluster.assert_invariants([run_id])[run_id]

    assert out.status == RunStatus.ERROR and out.error is not None
    assert out.error.type == "InternalServerError" and "overloaded" in out.error.message
    assert cluster.model_calls(run_id) == {0: 1, 1: 1, 2: 1}  # 1 + the agent's 2 retries
    assert [(m.role, m.content) for m in out.messages] == [("system", "Do what the script says."), ("user", "hello")]
    assert cluster.events(run_id) == ["retry", "retry", "error"]


def test_a_worker_killed_in_a_fallback_models_call_resumes_the_step_on_the_fallback(cluster: Cluster) -> None:
    # Given a primary model that fails for good, and its fallback's call held in flight
    primary = ScriptConfig(faults=[Fault(status=500, times=None, message="primary is down")])
    cluster.script(by_model={"scripted-primary": primary, "scripted-backup": ScriptConfig(final_text="backup: {user}")})
    cluster.model.holding.hold("scripted-backup")
    cluster.start_worker()
    cluster.start_sweeper()
    run_id = cluster.client.start(FALLBACK_AGENT, input="hello").run_id
    wait_until(
        lambda: any(r["model"] == "scripted-backup" for r in cluster.model.requests_for(run_id)),
        timeout=20, what="the fallback model's call to be in flight",
    )  # fmt: skip
    assert cluster.store.get_record(run_id).model_index == 1  # written before the call
    [marker] = cluster.dir.glob(f"model-{run_id}-0.*")  # both calls of the step, one process

    # When the pool process making the fallback's call is killed
    os.kill(int(marker.suffix[1:]), signal.SIGKILL)
    cluster.model.holding.release()

    # Then the step, taken back once its lease expired, calls the fallback, not the primary again
    out = cluster.wait_final([run_id])[run_id]
    assert out.status == RunStatus.COMPLETED and out.content == "backup: hello"
    models = [r["model"] for r in cluster.model.requests_for(run_id)]
    assert models == ["scripted-primary", "scripted-backup", "scripted-backup"]
    assert out.messages[-1].model == "scripted-backup"
    # Taken back by the sweeper (lease_expired) or by the killed task's redelivery (no event),
    # under a later claim than the fallback's (its claim was epoch 1, the fallback moved it to 2);
    # one fallback, then the move to COMPLETED
    assert [e for e in cluster.events(run_id) if e != "lease_expired"] == ["fallback", "completed"]
    [epoch] = cluster.answer_epochs(run_id)
    assert epoch is not None and epoch >= 3
