"""Teams run by the in-memory dispatcher: delegation, fan-in, a member's failure and continue, and
cancels, on a real SQLite store. A real worker runs teams in tests/integration/test_teams.py
(parallel members, a waiting team holding no worker, a cancel fencing steps in flight, nesting)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from orchestrator import Agent, RunBusyError, RunOutput, RunStatus, Team
from orchestrator.team import TO_MEMBER, TO_MEMBERS, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import CountingModel

S = RunStatus


class ResearchTeam:
    """A leader with a researcher (one tool, `search`) and a writer (no tools), each on its own
    counting scripted model; `searched` lists the researcher's tool calls."""

    def __init__(self, *, researcher: ScriptConfig | None = None, writer: ScriptConfig | None = None) -> None:
        t = uuid.uuid4().hex[:6]
        self.searched: list[str] = []

        def search(query: str) -> str:
            """Search the web."""
            self.searched.append(query)
            return f"facts about {query}"

        self.researcher_model = CountingModel(
            script=researcher
            or ScriptConfig(
                batches=[[{"tool": "search", "arguments": {"query": "otters"}}]], final_text="Research: {tool_results}"
            )
        )
        self.writer_model = CountingModel(script=writer or ScriptConfig(final_text="Draft about {user}"))
        self.researcher = Agent(
            name=f"researcher-{t}", model=self.researcher_model, tools=[search], role="Finds facts on the web."
        )
        self.writer = Agent(name=f"writer-{t}", model=self.writer_model, role="Writes short articles.")
        self.leader_model = CountingModel()
        self.team = Team(
            name=f"team-{t}",
            model=self.leader_model,
            members=[self.researcher, self.writer],
            instructions="Research, then write.",
        )

    def leader_calls(self, *calls: dict[str, Any]) -> None:
        """The leader's first turn makes these calls; its second answers with their results."""
        self.leader_model.script = ScriptConfig(batches=[list(calls)], final_text="Team answer: {tool_results}")

    def to(self, member: Agent, task: str) -> dict[str, Any]:
        return {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": task}}


def members_of(out: RunOutput) -> dict[str, RunOutput]:
    return {m.agent_name.split("-")[0]: m for m in out.member_runs}


# ---------------------------------------------------------------- delegation and fan-in


def test_a_leader_delegates_to_two_members_whose_answers_come_back_as_its_tool_results(
    inline: InMemoryDispatcher,
) -> None:
    crew = ResearchTeam()
    crew.leader_calls(crew.to(crew.researcher, "find facts on otters"), crew.to(crew.writer, "write about otters"))

    out = crew.team.run("otters", session_id="s-otters")

    assert out.status == S.COMPLETED, out.error
    assert [m.role for m in out.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    members = members_of(out)
    research, draft = members["researcher"], members["writer"]
    for member in (research, draft):
        assert member.status == S.COMPLETED and member.parent_run_id == out.run_id
        assert member.session_id == out.session_id
    # Each member ran its own loop: the researcher called its tool, the writer answered at once.
    assert [m.role for m in research.messages] == ["user", "assistant", "tool", "assistant"]
    assert research.messages[0].content == "find facts on otters"
    assert research.content == "Research: facts about otters"
    assert [m.role for m in draft.messages] == ["user", "assistant"]
    assert crew.searched == ["otters"]
    # The leader got each member's answer exactly once, as the result of the call that asked for it.
    calls = {c["id"] for c in out.messages[2].tool_calls or []}
    results = {m.tool_call_id: m for m in out.messages if m.role == "tool"}
    assert set(results) == calls
    by_member = {m.tool_args["member_id"]: m for m in results.values() if m.tool_args}
    assert by_member[member_id(crew.researcher)].content == research.content
    assert by_member[member_id(crew.writer)].content == draft.content
    assert not any(m.tool_call_error for m in results.values())
    # Results come back in the order the leader asked.
    assert out.content == f"Team answer: {research.content}; {draft.content}"
    # The leader's system message lists the members with their ids and roles.
    system = out.messages[0].content or ""
    assert f"ID: {member_id(crew.researcher)}" in system and "Role: Finds facts on the web." in system
    assert "delegate_task_to_member(member_id, task)" in system and "Research, then write." in system
    # The team was parked while its members ran, and woken once by the last member's fan-in.
    team_steps = [(s.kind, s.seq) for s in inline.published if s.run_id == out.run_id]
    assert team_steps == [("model", 0), ("tools", 1), ("model", 3)]


def test_delegating_to_all_members_returns_one_result_with_every_answer_labelled(inline: InMemoryDispatcher) -> None:
    crew = ResearchTeam(researcher=ScriptConfig(final_text="Research on {user}"))
    crew.leader_calls({"tool": TO_MEMBERS, "arguments": {"task": "otters"}})

    out = crew.team.run("otters")

    assert out.status == S.COMPLETED, out.error
    (result,) = [m for m in out.messages if m.role == "tool"]
    assert result.tool_name == TO_MEMBERS and not result.tool_call_error
    assert result.content == (
        f"Agent {crew.researcher.name}: Research on otters\n\nAgent {crew.writer.name}: Draft about otters"
    )


def test_a_member_tool_error_stays_inside_the_member(inline: InMemoryDispatcher) -> None:
    t = uuid.uuid4().hex[:6]

    def broken(query: str) -> str:
        """Always fails."""
        raise ValueError(f"broken on {query}")

    member = Agent(
        name=f"fixer-{t}", model=CountingModel(script=ScriptConfig(final_text="I could not: {tool_results}")),
        tools=[broken],
    )  # fmt: skip
    to_fixer = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "fix it"}}
    leader = CountingModel(script=ScriptConfig(batches=[[to_fixer]], final_text="Team answer: {tool_results}"))
    team = Team(name=f"team-{t}", model=leader, members=[member])

    out = team.run("go")

    assert out.status == S.COMPLETED, out.error
    (run,) = out.member_runs
    assert run.status == S.COMPLETED
    errors = [m for m in run.messages if m.tool_call_error]
    assert len(errors) == 1 and errors[0].content == "broken on fix it"
    assert not any(m.tool_call_error for m in out.messages)
    assert [m.content for m in out.messages if m.role == "tool"] == ["I could not: broken on fix it"]


def test_an_unknown_member_id_is_a_tool_error_the_leader_reads(inline: InMemoryDispatcher) -> None:
    crew = ResearchTeam()
    crew.leader_calls({"tool": TO_MEMBER, "arguments": {"member_id": "nobody", "task": "x"}})

    out = crew.team.run("otters")

    assert out.status == S.COMPLETED and out.member_runs == []
    (result,) = [m for m in out.messages if m.role == "tool"]
    assert result.tool_call_error and "no member with id 'nobody'" in (result.content or "")
    assert member_id(crew.researcher) in (result.content or "")


# ---------------------------------------------------------------- failure and continue


def test_a_failed_member_fails_the_team_and_continue_resumes_that_member_in_place_then_the_leader(
    inline: InMemoryDispatcher,
) -> None:
    # Given a researcher whose second model call fails for good (400), after its tool ran
    crew = ResearchTeam(
        researcher=ScriptConfig(
            batches=[[{"tool": "search", "arguments": {"query": "otters"}}]],
            final_text="Research: {tool_results}",
            faults=[Fault(turn=2, status=400, times=1, message="scripted bad request")],
        )
    )
    crew.leader_calls(crew.to(crew.researcher, "facts"), crew.to(crew.writer, "draft"))

    failed = crew.team.run("otters")

    # Then the team is in ERROR naming the member run and its error, with every message kept
    assert failed.status == S.ERROR
    members = members_of(failed)
    bad, writer_done = members["researcher"], members["writer"]
    assert bad.status == S.ERROR and bad.error is not None and bad.error.type == "BadRequestError"
    assert failed.error is not None and failed.error.type == "MemberRunError"
    assert bad.run_id in failed.error.message and "scripted bad request" in failed.error.message
    assert [m.role for m in bad.messages] == ["user", "assistant", "tool"]
    assert [m.role for m in failed.messages][:3] == ["system", "user", "assistant"]
    assert writer_done.status == S.COMPLETED
    writer_calls = len(crew.writer_model.calls)

    # When the team is continued
    resumed = crew.team.continue_run(failed.run_id)

    # Then the failed member continued in place, the writer did not run again, and the leader finished
    assert resumed.run_id == failed.run_id and resumed.status == S.COMPLETED, resumed.error
    after = members_of(resumed)
    assert after["researcher"].run_id == bad.run_id and after["researcher"].status == S.COMPLETED
    assert after["researcher"].messages[: len(bad.messages)] == bad.messages
    assert after["writer"].seq == writer_done.seq
    assert len(crew.writer_model.calls) == writer_calls
    assert crew.searched == ["otters"]  # the member's finished tool was not re-run
    results = [m for m in resumed.messages if m.role == "tool"]
    answers = [after["researcher"].content or "", writer_done.content or ""]
    assert sorted(m.content or "" for m in results) == sorted(answers)
    assert resumed.error is None
    session = inline.client.get_session(resumed.session_id)
    assert session is not None and [r.run_id for r in session.runs] == [failed.run_id]


def delegated(inline: InMemoryDispatcher) -> tuple[ResearchTeam, str]:
    """A team run that delegated to both members, WAITING while their first steps are queued."""
    crew = ResearchTeam()
    crew.leader_calls(crew.to(crew.researcher, "facts"), crew.to(crew.writer, "draft"))
    inline.autorun = False
    team_id = crew.team.start("otters").run_id
    inline.run_next()  # the leader's model call
    inline.run_next()  # its tool step: the members start
    return crew, team_id


def test_continuing_a_team_waiting_on_its_members_returns_its_run_id_and_changes_nothing(
    inline: InMemoryDispatcher,
) -> None:
    # Given a team that delegated, WAITING while its members' first steps are queued
    crew, team_id = delegated(inline)
    store = inline.store
    team = store.get_record(team_id)
    members = store.children(team_id)
    assert team.status == S.WAITING and len(members) == 2
    published = list(inline.published)

    # When it is continued (a double click, a retrying producer)
    handle = inline.client.continue_run(team_id)

    # Then it is a no-op: the same run id, the team and its members as they were, nothing enqueued
    assert handle.run_id == team_id
    assert store.get_record(team_id) == team
    assert store.children(team_id) == members
    assert inline.published == published
    with pytest.raises(RunBusyError, match="WAITING; it cannot take new input"):
        inline.client.continue_run(team_id, input="more")
    # And the members run once each, then the leader finishes
    assert inline.run_until_idle() == 5  # researcher: model, tools, model; writer: model; leader: model
    out = inline.client.get_run(team_id)
    assert out.status == S.COMPLETED, out.error
    assert {m.run_id for m in out.member_runs} == {m.run_id for m in members}
    assert crew.searched == ["otters"] and len(crew.writer_model.calls) == 1
    assert len(crew.leader_model.calls) == 2


# ---------------------------------------------------------------- cancel


def test_cancelling_a_waiting_team_cancels_its_members_and_drops_their_queued_steps(
    inline: InMemoryDispatcher,
) -> None:
    # Given a team that delegated, whose members' first steps are queued
    crew, team_id = delegated(inline)
    client = inline.client
    assert client.store.get_record(team_id).status == S.WAITING
    members = client.store.children(team_id)
    assert {s.run_id for s in inline.pending} == {m.run_id for m in members}

    # When the team is cancelled
    out = client.cancel(team_id)

    # Then every member is cancelled, and their steps, delivered, are dropped by the claim
    assert out.status == S.CANCELLED
    assert {m.status for m in out.member_runs} == {S.CANCELLED}
    assert inline.run_until_idle() == 2
    assert crew.researcher_model.calls == [] and crew.writer_model.calls == []
    after = client.get_run(team_id)
    assert after.status == S.CANCELLED and after.messages == out.messages
    assert {m.status for m in after.member_runs} == {S.CANCELLED}


def test_a_member_cancelled_on_its_own_is_a_tool_error_the_leader_reads_and_the_team_goes_on(
    inline: InMemoryDispatcher,
) -> None:
    # Given a team waiting on its writer
    crew = ResearchTeam()
    crew.leader_calls(crew.to(crew.writer, "draft"))
    inline.autorun = False
    team_id = crew.team.start("otters").run_id
    inline.run_next()
    inline.run_next()
    (writer,) = inline.client.store.children(team_id)

    # When the writer alone is cancelled
    inline.client.cancel(writer.run_id)
    inline.run_until_idle()

    # Then the leader is told, and answers
    out = inline.client.get_run(team_id)
    assert out.status == S.COMPLETED, out.error
    (result,) = [m for m in out.messages if m.role == "tool"]
    assert result.tool_call_error
    assert result.content == f"member run {writer.run_id} ({crew.writer.name}) was cancelled before it answered"
    assert crew.writer_model.calls == []
