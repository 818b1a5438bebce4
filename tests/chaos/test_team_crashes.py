"""Workers die while a team's members work: the team completes, each member ran its finished
tools once, and the leader received each member's answer exactly once.

Worker subprocesses (prefork) run the team of `tests.chaos.team_agents`; a sweeper runs in the
test. The scripted model answers the leader and each member by model id.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from orchestrator import RunOutput, RunStatus
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import calls
from tests.chaos.harness import Cluster
from tests.chaos.team_agents import RESEARCHER, TEAM, WRITER
from tests.chaos.team_harness import delegate, delegation_calls, start_team_worker

pytestmark = pytest.mark.chaos
S = RunStatus


def team_script(cluster: Cluster, **members: ScriptConfig) -> None:
    """The leader delegates to the researcher and the writer in one batch, then sums up."""
    by_model: dict[str, Any] = {
        "leader": ScriptConfig(
            batches=[[delegate(RESEARCHER, "research otters"), delegate(WRITER, "write about otters")]],
            final_text="Team: {tool_results}",
        ),
        "researcher": ScriptConfig(batches=[calls("r1", "r2")], final_text="R({tool_results})"),
        "writer": ScriptConfig(batches=[calls("w1")], final_text="W({tool_results})"),
        **members,
    }
    cluster.script(by_model=by_model)


def member(cluster: Cluster, team_run_id: str, agent: str) -> RunOutput | None:
    return next((m for m in cluster.store.get_output(team_run_id).member_runs if m.agent_name == agent), None)


def assert_leader_got_each_answer_once(cluster: Cluster, team_run_id: str) -> RunOutput:
    """The team completed; each delegation call has one result, the member's own answer; the
    leader's steps each called the model once; the fan-in moved the team once."""
    out = cluster.assert_invariants([team_run_id])[team_run_id]
    assert out.status == S.COMPLETED, cluster.diagnose([team_run_id])
    members = {m.agent_name: m for m in out.member_runs}
    assert set(members) == {RESEARCHER, WRITER}
    cluster.assert_invariants([m.run_id for m in out.member_runs], extra_model_calls=1)
    results = {m.tool_call_id: m for m in out.messages if m.role == "tool"}
    for call in delegation_calls(cluster, team_run_id):
        (answerer,) = [m for m in out.member_runs if m.run_id in _children_of(cluster, team_run_id, call.id)]
        assert answerer.status == S.COMPLETED
        assert results[call.id].content == answerer.content and not results[call.id].tool_call_error
    assert len(results) == 2
    assert [e["kind"] for e in cluster.store.get_events(team_run_id)].count("fan_in") == 1
    assert out.content == f"Team: {members[RESEARCHER].content}; {members[WRITER].content}"
    return out


def _children_of(cluster: Cluster, team_run_id: str, call_id: str) -> set[str]:
    return {c.run_id for c in cluster.store.children(team_run_id) if c.parent_tool_call_id == call_id}


def test_a_worker_killed_during_a_members_tool_batch_reruns_only_its_unfinished_call(cluster: Cluster) -> None:
    # Given a researcher whose batch holds in r2 after r1 finished and was committed, and a
    # writer that finished (it runs beside the researcher: killed mid-w1, w1 would rightly run again)
    team_script(cluster)
    cluster.flag("hold-r2")
    first = start_team_worker(cluster)
    cluster.start_sweeper()
    team_run_id = cluster.client.start(TEAM, input="otters").run_id
    cluster.wait_tool_started("r2")
    wait_until(
        lambda: (r := member(cluster, team_run_id, RESEARCHER)) is not None and len(r.tools) == 1,
        timeout=20, what="r1's result to be committed",
    )  # fmt: skip
    wait_until(
        lambda: (w := member(cluster, team_run_id, WRITER)) is not None and w.status == S.COMPLETED,
        timeout=20, what="the writer to complete",
    )  # fmt: skip
    assert cluster.store.get_record(team_run_id).status == S.WAITING

    # When the whole worker is killed, and another one starts
    first.kill()
    cluster.unflag("hold-r2")
    start_team_worker(cluster)

    # Then the team completes; r1 and w1 ran once, only the unfinished r2 ran again
    out = assert_leader_got_each_answer_once(cluster, team_run_id)
    research = next(m for m in out.member_runs if m.agent_name == RESEARCHER)
    writing = next(m for m in out.member_runs if m.agent_name == WRITER)
    assert cluster.attempts(research.run_id) == {"r1": 1, "r2": 2}
    assert sorted(cluster.effects(research.run_id).values()) == ["r1", "r2"]
    assert cluster.attempts(writing.run_id) == {"w1": 1}
    assert research.content == "R(r1: applied; r2: applied)"  # r1's result was committed first


def test_a_pool_process_killed_during_the_step_that_fans_in_redoes_it_once(cluster: Cluster) -> None:
    # Given a writer that answers at once, last: its one model call, whose commit fans in, hangs
    team_script(cluster, writer=ScriptConfig(batches=[], final_text="W", delay_s=30))
    start_team_worker(cluster)
    cluster.start_sweeper()
    team_run_id = cluster.client.start(TEAM, input="otters").run_id
    writing = wait_until(lambda: member(cluster, team_run_id, WRITER), timeout=20, what="the writer's run")
    pid = cluster.wait_model_call(writing.run_id, seq=0)
    cluster.wait_status(member(cluster, team_run_id, RESEARCHER).run_id, S.COMPLETED)  # type: ignore[union-attr]

    # When the pool process making that call is killed (and the model answers at once from now on)
    team_script(cluster, writer=ScriptConfig(batches=[], final_text="W"))
    os.kill(pid, signal.SIGKILL)

    # Then the writer's step runs again once its lease expires and fans in once
    out = assert_leader_got_each_answer_once(cluster, team_run_id)
    research = next(m for m in out.member_runs if m.agent_name == RESEARCHER)
    assert cluster.model_calls(writing.run_id)[0] == 2
    assert cluster.attempts(research.run_id) == {"r1": 1, "r2": 1}
    # Taken back once its lease expired (by the sweeper, or by the redelivery): a later claim answered
    epochs = cluster.answer_epochs(writing.run_id)
    assert len(epochs) == 1 and epochs[0] is not None and epochs[0] >= 2, epochs


def test_a_process_that_dies_between_the_fan_in_commit_and_the_leaders_publish_loses_nothing(
    cluster: Cluster,
) -> None:
    # Given a team waiting on its members, the writer held in its tool
    team_script(cluster)
    cluster.flag("hold-w1")
    start_team_worker(cluster)
    cluster.start_sweeper()
    team_run_id = cluster.client.start(TEAM, input="otters").run_id
    cluster.wait_tool_started("w1")
    assert cluster.store.get_record(team_run_id).status == S.WAITING

    # When the process that commits the last member's answer dies before publishing the leader's step
    cluster.flag(f"crash-before-publish-{team_run_id}")
    cluster.unflag("hold-w1")

    # Then the fan-in it committed stands, and the sweeper publishes the leader's step
    wait_until(
        lambda: (cluster.dir / f"crash-before-publish-{team_run_id}.taken").exists(),
        timeout=20, what="the crash between the fan-in and the publish",
    )  # fmt: skip
    out = assert_leader_got_each_answer_once(cluster, team_run_id)
    for m in out.member_runs:
        assert set(cluster.attempts(m.run_id).values()) == {1}
