"""A model that fails: transient errors are retried after Retry-After, persistent ones end the
run in ERROR after the agent's retries, with the conversation kept."""

from __future__ import annotations

import itertools

import pytest

from orchestrator import RunStatus
from orchestrator.testing.script import Fault
from tests.chaos.agents import calls
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
