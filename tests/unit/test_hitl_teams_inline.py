"""A member's pause at any depth, run by the in-memory dispatcher on a real SQLite store: every
team above a paused member is PAUSED with the member's requirements, a decision sent to the top
team resumes that member in place and then its leaders (nothing finished runs again, no leader is
asked again before its fan-in), siblings that end meanwhile are fanned in, two paused members are
decided one by one, and cancels and failures move the team on. Real workers, PostgreSQL and a
worker replaced between the pause and the decision: tests/integration/test_hitl_teams.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from orchestrator import Agent, BrokerUnavailableError, Decision, RunNotPausedError, RunOutput, RunStatus, Team, tool
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import CountingModel

S = RunStatus
CONFIRM = Decision(kind="confirm")


def to(member: Agent | Team, task: str) -> dict[str, Any]:
    return {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": task}}


def pay_call(amount: int, to: str) -> dict[str, Any]:
    return {"tool": "pay", "arguments": {"amount": amount, "to": to}}


class Crew:
    """Agents and teams on counting scripted models; `pay` needs a person's confirmation and
    lists what it paid in `paid`; `search` is a plain tool."""

    def __init__(self) -> None:
        self.t = uuid.uuid4().hex[:6]
        self.paid: list[tuple[int, str]] = []
        self.models: dict[str, CountingModel] = {}

        @tool(requires_confirmation=True)
        def pay(amount: int, to: str) -> str:
            """Pay someone.

            Args:
                amount: In cents.
                to: Who is paid.
            """
            self.paid.append((amount, to))
            return f"paid {amount} to {to}"

        def search(query: str) -> str:
            """Search the web."""
            return f"facts about {query}"

        self.pay, self.search = pay, search

    def payer(self, name: str, amount: int, to: str) -> Agent:
        """A member whose first turn calls `pay`, then answers with what it read."""
        model = self.model(name, ScriptConfig(batches=[[pay_call(amount, to)]], final_text=f"{name}: {{tool_results}}"))
        return Agent(name=f"{name}-{self.t}", model=model, tools=[self.pay])

    def searcher(self, name: str, *, faults: list[Fault] | None = None) -> Agent:
        """A member that searches (a tool step of its own), then answers."""
        script = ScriptConfig(
            batches=[[{"tool": "search", "arguments": {"query": "otters"}}]],
            final_text=f"{name}: {{tool_results}}",
            faults=faults or [],
        )
        return Agent(name=f"{name}-{self.t}", model=self.model(name, script), tools=[self.search])

    def team(self, name: str, members: list[Agent | Team], *calls: dict[str, Any], **kwargs: Any) -> Team:
        """A team whose leader makes `calls` in its first turn, then answers with their results."""
        model = self.model(name, ScriptConfig(batches=[list(calls)], final_text=f"{name}: {{tool_results}}"))
        return Team(name=f"{name}-{self.t}", model=model, members=members, **kwargs)

    def model(self, name: str, script: ScriptConfig) -> CountingModel:
        self.models[name] = CountingModel(script=script)
        return self.models[name]

    def calls(self) -> dict[str, int]:
        """How many model calls each agent's model answered so far."""
        return {name: len(model.calls) for name, model in self.models.items()}


def nested(crew: Crew) -> tuple[Team, Team, Agent, Agent]:
    """top -> (desk -> payer), writer: the payer, two levels down, pays ann 5."""
    payer = crew.payer("payer", 5, "ann")
    desk = crew.team("desk", [payer], to(payer, "pay ann"))
    writer = crew.searcher("writer")
    top = crew.team("top", [desk, writer], to(desk, "pay"), to(writer, "write"))
    return top, desk, payer, writer


def by_name(out: RunOutput) -> dict[str, RunOutput]:
    """Every run of the tree under `out`, by its agent's short name."""
    found: dict[str, RunOutput] = {}
    for member in out.member_runs:
        found[member.agent_name.rsplit("-", 1)[0]] = member
        found.update(by_name(member))
    return found


# ---------------------------------------------------------------- a member two levels down


@pytest.mark.parametrize("how", ["decide", "continue_run"])
def test_a_member_two_levels_down_pauses_every_team_above_it_and_a_decision_on_the_top_team_resumes_it_in_place(
    inline: InMemoryDispatcher, how: str
) -> None:
    crew = Crew()
    top, _, payer, _ = nested(crew)

    out = top.run("go")

    # Then every team above the payer is PAUSED, and the top team carries the payer's requirement
    runs = by_name(out)
    assert out.status == S.PAUSED and out.is_paused
    assert runs["desk"].status == S.PAUSED and runs["payer"].status == S.PAUSED
    assert runs["writer"].status == S.COMPLETED
    [req] = out.active_requirements
    assert out.requirements == [req] and req.pause_type == "confirmation"
    assert req.member_agent_name == payer.name and req.member_run_id == runs["payer"].run_id
    assert req.run_id == runs["payer"].run_id  # the run whose call it is
    assert req.tool_execution is not None and req.tool_execution.tool_args == {"amount": 5, "to": "ann"}
    [desk_req] = runs["desk"].active_requirements
    assert desk_req.id == req.id and desk_req.member_run_id == runs["payer"].run_id
    assert crew.paid == [] and crew.calls() == {"payer": 1, "desk": 1, "writer": 2, "top": 1}
    assert inline.client.pending(agent_name=payer.name)[0].id == req.id
    for run in (out, runs["desk"], runs["payer"]):
        assert inline.store.get_record(run.run_id).lease_owner is None  # nothing held while PAUSED

    # When it is decided through the top team's run id
    if how == "decide":
        inline.client.decide(out.run_id, req.id, CONFIRM, by="ann")
        done = inline.client.get_run(out.run_id)
    else:
        req.confirm()
        done = top.continue_run(run_id=out.run_id, requirements=[req], by="ann")

    # Then the payer resumed in place, then the desk's leader, then the top's: each leader asked
    # once more (its fan-in), nothing that had finished ran again, nothing was delegated twice
    assert done.run_id == out.run_id and done.status == S.COMPLETED, done.error
    after = by_name(done)
    assert {k: v.run_id for k, v in after.items()} == {k: v.run_id for k, v in runs.items()}
    assert crew.paid == [(5, "ann")]
    assert crew.calls() == {"payer": 2, "desk": 2, "writer": 2, "top": 2}
    assert after["payer"].content == "payer: paid 5 to ann"
    assert done.content == "top: desk: payer: paid 5 to ann; writer: facts about otters"
    assert [r.status for r in done.requirements] == ["decided"] and done.active_requirements == []
    assert done.requirements[0].decided_by == "ann"
    kinds = [e["kind"] for e in inline.store.get_events(out.run_id)]
    assert kinds.count("delegate") == 1 and kinds.count("paused") == 1 and kinds.count("resume") == 1


def test_a_sibling_that_completes_while_its_team_is_paused_is_fanned_in_with_the_paused_member(
    inline: InMemoryDispatcher,
) -> None:
    # Given a team whose payer pauses while its writer is still at work
    crew = Crew()
    payer, writer = crew.payer("payer", 7, "bob"), crew.searcher("writer")
    team = crew.team("team", [payer, writer], to(payer, "pay bob"), to(writer, "write"))
    inline.autorun = False
    team_id = team.start("go").run_id
    for _ in range(4):  # leader: model, tools; payer: model; writer: model
        inline.run_next()
    inline.run_next()  # the payer's tool step: it pauses
    assert inline.client.get_run(team_id).status == S.PAUSED

    # When the writer finishes (its tool step, its final answer) while the team is PAUSED
    assert inline.run_until_idle() == 2
    out = inline.client.get_run(team_id)
    runs = by_name(out)
    assert runs["writer"].status == S.COMPLETED and runs["payer"].status == S.PAUSED
    # Then the team stays PAUSED, its leader not asked again, and no sweep moves it
    assert out.status == S.PAUSED and crew.calls()["team"] == 1
    assert team_id not in inline.store.teams.to_fan_in()
    assert not inline.sweep().fanned_in
    assert inline.store.get_record(team_id).status == S.PAUSED

    # And once the payer is decided, the team fans in with both answers
    inline.autorun = True
    inline.client.decide(team_id, out.active_requirements[0].id, CONFIRM)
    done = inline.client.get_run(team_id)
    assert done.status == S.COMPLETED, done.error
    assert done.content == "team: payer: paid 7 to bob; writer: facts about otters"
    assert crew.calls() == {"payer": 2, "writer": 2, "team": 2} and crew.paid == [(7, "bob")]


# ---------------------------------------------------------------- two paused members


def test_two_members_paused_in_one_delegation_are_decided_independently(inline: InMemoryDispatcher) -> None:
    crew = Crew()
    ann, bob = crew.payer("ann", 1, "ann"), crew.payer("bob", 2, "bob")
    team = crew.team("team", [ann, bob], to(ann, "pay ann"), to(bob, "pay bob"))

    out = team.run("go")

    assert out.status == S.PAUSED
    reqs = {r.member_agent_name: r for r in out.active_requirements}
    assert set(reqs) == {ann.name, bob.name}
    runs = by_name(out)
    assert {reqs[ann.name].member_run_id, reqs[bob.name].member_run_id} == {runs["ann"].run_id, runs["bob"].run_id}

    # When ann's is decided: ann resumes and completes; the team waits on for bob's
    inline.client.decide(out.run_id, reqs[ann.name].id, CONFIRM)
    half = inline.client.get_run(out.run_id)
    assert half.status == S.PAUSED and by_name(half)["ann"].status == S.COMPLETED
    assert [r.id for r in half.active_requirements] == [reqs[bob.name].id]
    assert crew.paid == [(1, "ann")] and crew.calls() == {"ann": 2, "bob": 1, "team": 1}

    # When bob's is rejected through continue_run: bob reads the note, and the team fans in both
    [bob_req] = half.active_requirements
    bob_req.reject(note="not bob")
    done = team.continue_run(run_id=out.run_id, requirements=[bob_req])
    assert done.status == S.COMPLETED, done.error
    assert done.content == "team: ann: paid 1 to ann; bob: not bob"
    assert crew.paid == [(1, "ann")] and crew.calls() == {"ann": 2, "bob": 2, "team": 2}
    events = [e["kind"] for e in inline.store.get_events(out.run_id)]
    assert events.count("paused") == 1 and events.count("resume") == 1 and events.count("fan_in") == 1


# ---------------------------------------------------------------- a leader's own flagged call


def test_a_leaders_flagged_call_holds_back_the_delegations_of_its_batch_until_it_is_decided(
    inline: InMemoryDispatcher,
) -> None:
    crew = Crew()
    writer = crew.searcher("writer")
    team = crew.team("team", [writer], pay_call(9, "cat"), to(writer, "write"), tools=[crew.pay])

    out = team.run("go")

    # Then the leader paused on its own call and no member was started
    assert out.status == S.PAUSED and out.member_runs == [] and crew.calls() == {"writer": 0, "team": 1}
    [req] = out.active_requirements
    assert req.run_id == out.run_id and req.member_run_id is None and req.member_agent_name is None
    assert inline.store.teams.to_fan_in() == [] and not inline.sweep().fanned_in

    # When it is confirmed: the call runs, then the delegation starts, and the leader answers both
    inline.client.decide(out.run_id, req.id, CONFIRM)
    done = inline.client.get_run(out.run_id)
    assert done.status == S.COMPLETED, done.error
    assert crew.paid == [(9, "cat")] and [m.status for m in done.member_runs] == [S.COMPLETED]
    assert done.content == "team: paid 9 to cat; writer: facts about otters"
    assert crew.calls() == {"writer": 2, "team": 2}


# ---------------------------------------------------------------- cancel and failure


def test_cancelling_a_paused_team_cancels_its_paused_members_and_a_decision_after_that_is_refused(
    inline: InMemoryDispatcher,
) -> None:
    crew = Crew()
    top, *_ = nested(crew)
    out = top.run("go")
    [req] = out.active_requirements

    cancelled = inline.client.cancel(out.run_id)

    runs = by_name(cancelled)
    assert cancelled.status == S.CANCELLED
    assert runs["desk"].status == S.CANCELLED and runs["payer"].status == S.CANCELLED
    assert runs["writer"].status == S.COMPLETED
    for run_id in (out.run_id, runs["payer"].run_id):
        with pytest.raises(RunNotPausedError, match="cannot be decided now"):
            inline.client.decide(run_id, req.id, CONFIRM)
    assert inline.client.pending(agent_name=req.member_agent_name) == []
    assert crew.paid == [] and crew.calls()["payer"] == 1
    inline.sweep()
    assert inline.store.get_record(out.run_id).status == S.CANCELLED


def test_a_paused_member_cancelled_on_its_own_lets_its_teams_go_on_with_a_tool_error(
    inline: InMemoryDispatcher,
) -> None:
    crew = Crew()
    top, *_ = nested(crew)
    out = top.run("go")
    payer = by_name(out)["payer"]

    inline.client.cancel(payer.run_id)

    # Then the desk reads that its payer was cancelled, answers, and the top team completes
    done = inline.client.get_run(out.run_id)
    assert done.status == S.COMPLETED, done.error
    desk = by_name(done)["desk"]
    [result] = [m for m in desk.messages if m.role == "tool"]
    assert result.tool_call_error and result.content == (
        f"member run {payer.run_id} ({payer.agent_name}) was cancelled before it answered"
    )
    assert crew.paid == [] and crew.calls() == {"payer": 1, "desk": 2, "writer": 2, "top": 2}


def test_a_team_left_paused_for_a_member_that_stopped_without_its_fan_in_is_moved_on_by_the_sweeper(
    inline: InMemoryDispatcher,
) -> None:
    # Given a paused member cancelled by a process that died before its team's fan-in
    crew = Crew()
    top, *_ = nested(crew)
    out = top.run("go")
    payer = by_name(out)["payer"]
    inline.store.move(payer.run_id, src=(S.PAUSED,), dst=S.CANCELLED, bump_epoch=True, event="cancel")
    desk_id = by_name(out)["desk"].run_id
    assert inline.store.teams.to_fan_in() == [desk_id]  # the desk, not the top: its desk is PAUSED

    # When the sweeper passes
    report = inline.sweep()

    # Then the desk and the top team go on, and the desk reads a tool error for its payer
    assert report.fanned_in == [desk_id]
    done = inline.client.get_run(out.run_id)
    assert done.status == S.COMPLETED, done.error
    assert crew.paid == [] and crew.calls() == {"payer": 1, "desk": 2, "writer": 2, "top": 2}


def test_a_member_failing_while_its_sibling_is_paused_fails_the_team_at_once_and_a_continue_waits_for_the_decision(
    inline: InMemoryDispatcher,
) -> None:
    # Given a team whose payer pauses, and whose searcher then fails on its second model call
    crew = Crew()
    payer = crew.payer("payer", 3, "dan")
    searcher = crew.searcher("searcher", faults=[Fault(turn=2, status=400, times=1, message="scripted bad request")])
    team = crew.team("team", [payer, searcher], to(payer, "pay dan"), to(searcher, "search"))

    out = team.run("go")

    # Then the team failed at once, naming the searcher; the payer still waits for its decision
    runs = by_name(out)
    assert out.status == S.ERROR and out.error is not None and out.error.type == "MemberRunError"
    assert runs["searcher"].run_id in out.error.message
    assert runs["payer"].status == S.PAUSED and [r.member_agent_name for r in out.active_requirements] == [payer.name]

    # When the team is continued before the decision: the searcher continues in place and
    # completes, and the team is PAUSED again, for its payer
    again = team.continue_run(out.run_id)
    assert again.status == S.PAUSED and by_name(again)["searcher"].status == S.COMPLETED
    assert crew.calls() == {"payer": 1, "searcher": 3, "team": 1}

    # And once the payer is decided the team fans in both answers
    inline.client.decide(out.run_id, again.active_requirements[0].id, CONFIRM)
    done = inline.client.get_run(out.run_id)
    assert done.status == S.COMPLETED, done.error
    assert done.content == "team: payer: paid 3 to dan; searcher: facts about otters"
    assert crew.paid == [(3, "dan")] and crew.calls() == {"payer": 2, "searcher": 3, "team": 2}


def test_a_continue_with_the_decision_of_a_team_in_error_continues_its_failed_member_too(
    inline: InMemoryDispatcher,
) -> None:
    # Given a team in ERROR for its searcher, while its payer waits for a decision
    crew = Crew()
    payer = crew.payer("payer", 3, "dan")
    searcher = crew.searcher("searcher", faults=[Fault(turn=2, status=400, times=1, message="scripted bad request")])
    team = crew.team("team", [payer, searcher], to(payer, "pay dan"), to(searcher, "search"))
    out = team.run("go")
    assert out.status == S.ERROR
    [req] = out.active_requirements

    # When one continue carries the payer's decision
    req.confirm()
    done = team.continue_run(out, requirements=[req])

    # Then the decision is stored, the failed searcher continued in place, and the team fans in both
    assert done.status == S.COMPLETED, done.error
    assert done.content == "team: payer: paid 3 to dan; searcher: facts about otters"
    assert crew.paid == [(3, "dan")] and crew.calls() == {"payer": 2, "searcher": 3, "team": 2}


def test_a_continue_with_two_members_decisions_stores_both_before_it_publishes_so_a_broker_down_loses_none(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two members paused in one delegation, and a broker that refuses every step
    crew = Crew()
    ann, bob = crew.payer("ann", 1, "ann"), crew.payer("bob", 2, "bob")
    team = crew.team("team", [ann, bob], to(ann, "pay ann"), to(bob, "pay bob"))
    out = team.run("go")
    reqs = out.active_requirements
    for req in reqs:
        req.confirm()

    def down(step: object) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(inline, "publish", down)

    # When one continue carries both decisions, each of which queues its member again
    with pytest.raises(BrokerUnavailableError, match="nothing is lost"):
        inline.client.continue_run(out.run_id, requirements=reqs)

    # Then both are stored and both members are due (the sweeper publishes them), nothing ran yet
    stored = inline.client.get_run(out.run_id)
    assert [r.status for r in stored.requirements] == ["decided", "decided"]
    assert {by_name(stored)[n].status for n in ("ann", "bob")} == {S.QUEUED}
    assert crew.paid == []
