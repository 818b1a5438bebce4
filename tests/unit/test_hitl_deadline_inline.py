"""Deadlines that fire, run by the in-memory dispatcher on a real SQLite store with a clock the
test moves: each `on_timeout` policy at the agent's and a tool's level, acted on by a sweeper
pass (not by a continue), once, with an event that says why; a decision after the deadline is
refused, from a store opened again too; a cancel of a PAUSED run, and a paused member cancelled
on its own. A real worker's sweeper fires one in tests/integration/test_hitl_deadline_workers.py;
a decision racing a cancel on PostgreSQL is tests/integration/test_hitl_deadline_races.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from orchestrator import (
    Agent,
    Decision,
    DecisionExpiredError,
    RunNotPausedError,
    RunOutput,
    RunStatus,
    Team,
    tool,
)
from orchestrator.errors import InvalidInputError
from orchestrator.requirements import DEADLINE, RunRequirement
from orchestrator.store import Store
from orchestrator.store.database import open_engine
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from orchestrator.tools.tool import Tool
from tests.support import Clock, CountingModel

S = RunStatus
#: "Nobody decided": what a call rejected by its deadline reads as its result.
UNDECIDED = "nobody decided before the deadline; the call was not run"


def name() -> str:
    return f"deadline-{uuid.uuid4().hex[:8]}"


def payments(**flags: Any) -> tuple[list[tuple[int, str]], Tool]:
    paid: list[tuple[int, str]] = []

    @tool(requires_confirmation=True, **flags)
    def pay(amount: int, to: str) -> str:
        """Pay someone.

        Args:
            amount: In cents.
            to: Who is paid.
        """
        paid.append((amount, to))
        return f"paid {amount} to {to}"

    return paid, pay


def deadline_events(inline: InMemoryDispatcher, run_id: str) -> list[dict[str, Any]]:
    return [e["detail"] for e in inline.store.get_events(run_id) if e["kind"] == "deadline"]


def paused(agent: Agent | Team, text: str = "pay bob") -> tuple[RunOutput, RunRequirement]:
    out = agent.run(text)
    assert out.status == S.PAUSED
    return out, out.active_requirements[0]


def test_reject_at_the_agents_deadline_is_the_sweepers_decision_and_the_model_reads_it(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay], pause_timeout=60, on_timeout="reject")
    out, req = paused(agent)
    assert req.deadline_at == pytest.approx(req.created_at + 60) and req.on_timeout == "reject"

    clock.advance(59)
    assert not inline.sweep() and inline.store.get_record(out.run_id).status == S.PAUSED  # not yet
    clock.advance(2)
    report = inline.sweep()

    assert report.timed_out == [req.id]
    done = agent.client.get_run(out.run_id)
    assert done.status == S.COMPLETED and paid == []  # nobody had to continue it
    [result] = [m for m in done.messages if m.role == "tool"]
    assert result.content == UNDECIDED and result.tool_call_error
    [stored] = done.requirements
    assert stored.status == "decided" and stored.decided_by == DEADLINE and stored.confirmation is False
    [why] = deadline_events(inline, out.run_id)
    assert why["requirement"] == req.id and why["policy"] == "reject" and why["deadline_at"] == req.deadline_at
    decisions = [e["detail"] for e in inline.store.get_events(out.run_id) if e["kind"] == "decision"]
    assert [{k: d[k] for k in ("requirement", "by", "decision")} for d in decisions] == [
        {"requirement": req.id, "by": DEADLINE, "decision": f"reject ({UNDECIDED!r})"}
    ]
    assert not inline.sweep()  # once


def test_a_tools_approve_overrides_the_agents_policy_and_runs_the_call_at_its_own_deadline(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid, pay = payments(pause_timeout=30, on_timeout="approve")
    agent = Agent(name=name(), model=CountingModel(), tools=[pay], pause_timeout=3600, on_timeout="reject")
    out, req = paused(agent)
    assert req.deadline_at == pytest.approx(req.created_at + 30) and req.on_timeout == "approve"

    clock.advance(31)
    assert inline.sweep().timed_out == [req.id]

    done = agent.client.get_run(out.run_id)
    assert done.status == S.COMPLETED and paid == [(1, "pay bob")]
    assert done.requirements[0].confirmation is True and done.requirements[0].decided_by == DEADLINE
    assert [e["policy"] for e in deadline_events(inline, out.run_id)] == ["approve"]


def test_approve_cannot_make_up_a_persons_input_so_the_call_is_rejected(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    sent: list[str] = []

    @tool(requires_user_input=True, user_input_fields=["recipient"], pause_timeout=5, on_timeout="approve")
    def send_mail(subject: str, recipient: str) -> str:
        """Send a mail."""
        sent.append(recipient)
        return "sent"

    agent = Agent(name=name(), model=CountingModel(), tools=[send_mail])
    out, _ = paused(agent, "mail it")
    clock.advance(6)
    inline.sweep()

    done = agent.client.get_run(out.run_id)
    assert done.status == S.COMPLETED and sent == []
    assert [m.content for m in done.messages if m.role == "tool"] == [UNDECIDED]


def test_every_deadline_of_a_batch_fires_in_one_pass_and_the_run_resumes_once(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid, pay = payments()
    script = ScriptConfig(
        batches=[
            [
                {"tool": "pay", "arguments": {"amount": 5, "to": "ann"}},
                {"tool": "pay", "arguments": {"amount": 7, "to": "bo"}},
            ]
        ]
    )
    agent = Agent(name=name(), model=CountingModel(script=script), tools=[pay], pause_timeout=10)
    out = agent.run("pay both")
    assert len(out.active_requirements) == 2
    clock.advance(11)

    assert len(inline.sweep().timed_out) == 2
    done = agent.client.get_run(out.run_id)
    assert done.status == S.COMPLETED and paid == []
    assert [e["kind"] for e in inline.store.get_events(out.run_id)].count("resume") == 1


def test_cancel_at_the_deadline_cancels_the_run_and_voids_what_it_asked(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay], pause_timeout=60, on_timeout="cancel")
    out, req = paused(agent)
    clock.advance(61)

    assert inline.sweep().timed_out == [req.id]
    done = agent.client.get_run(out.run_id)
    assert done.status == S.CANCELLED and paid == []
    assert [r.status for r in done.requirements] == ["void"]
    kinds = [e["kind"] for e in inline.store.get_events(out.run_id)]
    assert kinds[-2:] == ["deadline", "cancel"] and deadline_events(inline, out.run_id)[0]["policy"] == "cancel"
    with pytest.raises(DecisionExpiredError):
        agent.client.decide(out.run_id, req.id, Decision(kind="confirm"))
    assert not inline.sweep()


def test_error_at_a_tools_deadline_ends_the_run_and_a_continue_pauses_the_call_again(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid, pay = payments(pause_timeout=20, on_timeout="error")
    agent = Agent(name=name(), model=CountingModel(), tools=[pay])
    out, req = paused(agent)
    clock.advance(21)

    assert inline.sweep().timed_out == [req.id]
    failed = agent.client.get_run(out.run_id)
    assert failed.status == S.ERROR and failed.error is not None
    assert failed.error.type == "PauseTimeoutError"
    assert req.tool_execution is not None
    for named in ("pay", req.tool_execution.tool_call_id, req.id, "Continue the run"):
        assert named in failed.error.message
    assert [r.status for r in failed.requirements] == ["expired"]
    assert [e["kind"] for e in inline.store.get_events(out.run_id)][-2:] == ["deadline", "error"]
    with pytest.raises(DecisionExpiredError, match="deadline passed"):
        agent.client.decide(out.run_id, req.id, Decision(kind="confirm"))

    agent.client.continue_run(out.run_id)
    again = agent.client.get_run(out.run_id)
    assert again.status == S.PAUSED and paid == []
    old, new = again.requirements
    assert old.id == req.id and old.status == "expired"
    assert new.status == "pending" and new.deadline_at is not None and req.deadline_at is not None
    assert new.deadline_at == pytest.approx(new.created_at + 20) and new.deadline_at > req.deadline_at
    new.confirm()
    done = agent.continue_run(run_id=out.run_id, requirements=[new])
    assert done.status == S.COMPLETED and paid == [(1, "pay bob")]


def test_a_decision_after_the_deadline_is_refused_before_the_sweep_and_from_a_store_opened_again(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay], pause_timeout=60)
    out, req = paused(agent)
    clock.advance(60)

    with pytest.raises(DecisionExpiredError, match="reject"):
        agent.client.decide(out.run_id, req.id, Decision(kind="confirm"), by="ann")
    # A process started afresh reads the deadline from the row.
    restarted = Store(open_engine(inline.settings.database_url), clock=clock)
    try:
        with pytest.raises(DecisionExpiredError):
            restarted.requirements.decide(out.run_id, req.id, Decision(kind="confirm"), by="ann", publish_grace=60)
    finally:
        restarted.dispose()
    assert inline.store.get_record(out.run_id).status == S.PAUSED and paid == []

    assert inline.sweep().timed_out == [req.id]  # the refused decision left the deadline's to act
    assert agent.client.get_run(out.run_id).requirements[0].decided_by == DEADLINE


def test_a_person_who_decides_in_time_is_not_overruled_by_the_deadline(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay], pause_timeout=60, on_timeout="cancel")
    out, req = paused(agent)
    clock.advance(59)
    req.confirm()
    agent.continue_run(run_id=out.run_id, requirements=[req], by="ann")
    clock.advance(10)

    assert not inline.sweep()
    done = agent.client.get_run(out.run_id)
    assert done.status == S.COMPLETED and paid == [(1, "pay bob")]
    assert done.requirements[0].decided_by == "ann" and deadline_events(inline, out.run_id) == []


def test_nobody_decides_as_the_deadline(inline: InMemoryDispatcher) -> None:
    _, pay = payments()
    out, req = paused(Agent(name=name(), model=CountingModel(), tools=[pay]))
    with pytest.raises(InvalidInputError, match="deadline"):
        inline.client.decide(out.run_id, req.id, Decision(kind="confirm"), by=DEADLINE)


# ---------------------------------------------------------------- a member's deadline


def team_paying(**flags: Any) -> tuple[Team, Agent, list[tuple[int, str]]]:
    paid, pay = payments(**flags)
    payer = Agent(name=name(), model=CountingModel(), tools=[pay], role="Pays.")
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(payer), "task": "pay ann"}}
    leader = CountingModel(script=ScriptConfig(batches=[[call]], final_text="Team: {tool_results}"))
    return Team(name=name(), model=leader, members=[payer]), payer, paid


def test_a_members_reject_at_the_deadline_resumes_the_member_then_its_team(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    team, _, paid = team_paying(pause_timeout=30)
    out, req = paused(team)
    assert req.member_run_id is not None
    clock.advance(31)

    assert inline.sweep().timed_out == [req.id]
    done = team.client.get_run(out.run_id)
    assert done.status == S.COMPLETED and paid == []
    assert [m.status for m in done.member_runs] == [S.COMPLETED]
    assert UNDECIDED in (done.content or "")
    assert deadline_events(inline, req.member_run_id)[0]["policy"] == "reject"


def test_a_members_error_at_the_deadline_fails_its_team_as_a_failed_member_does(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    team, _, paid = team_paying(pause_timeout=30, on_timeout="error")
    out, req = paused(team)
    clock.advance(31)

    inline.sweep()
    failed = team.client.get_run(out.run_id)
    assert failed.status == S.ERROR and failed.error is not None and failed.error.type == "MemberRunError"
    assert "PauseTimeoutError" in failed.error.message and req.id in failed.error.message
    [member] = failed.member_runs
    assert member.status == S.ERROR and member.error is not None and member.error.type == "PauseTimeoutError"

    team.client.continue_run(out.run_id)  # the member continues in place and pauses its call again
    [member] = team.client.get_run(out.run_id).member_runs
    assert member.status == S.PAUSED
    [new] = member.active_requirements
    new.confirm()
    team.client.decide(member.run_id, new.id, new.decision or Decision(kind="confirm"))
    done = team.client.wait(out.run_id)
    assert done.status == S.COMPLETED and paid == [(1, "pay ann")]


def test_a_members_cancel_at_the_deadline_cancels_the_whole_team_from_the_top(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    team, _, paid = team_paying(pause_timeout=30, on_timeout="cancel")
    out, req = paused(team)
    clock.advance(31)

    assert inline.sweep().timed_out == [req.id]
    done = team.client.get_run(out.run_id)
    assert done.status == S.CANCELLED and [m.status for m in done.member_runs] == [S.CANCELLED]
    assert [r.status for r in done.requirements] == ["void"] and paid == []
    assert req.member_run_id is not None and deadline_events(inline, req.member_run_id)[0]["policy"] == "cancel"


# ---------------------------------------------------------------- cancel of a PAUSED run


def test_cancelling_a_paused_run_voids_its_requirements_and_no_deadline_acts_after(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay], pause_timeout=60, on_timeout="approve")
    out, req = paused(agent)

    cancelled = agent.client.cancel(out.run_id)
    assert cancelled.status == S.CANCELLED and [r.status for r in cancelled.requirements] == ["void"]
    with pytest.raises(RunNotPausedError, match="CANCELLED"):
        agent.client.decide(out.run_id, req.id, Decision(kind="confirm"))
    clock.advance(61)
    assert not inline.sweep() and paid == []


def test_a_paused_member_cancelled_on_its_own_is_a_tool_error_its_team_reads_and_goes_on(
    inline: InMemoryDispatcher,
) -> None:
    team, _, paid = team_paying()
    out, req = paused(team)
    assert req.member_run_id is not None

    team.client.cancel(req.member_run_id)

    done = team.client.wait(out.run_id)
    assert done.status == S.COMPLETED and paid == []
    assert [m.status for m in done.member_runs] == [S.CANCELLED]
    assert "cancelled before it answered" in (done.content or "")


def test_a_member_whose_team_was_cancelled_is_decided_by_nobody_not_even_its_deadline(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    team, _, paid = team_paying(pause_timeout=30, on_timeout="approve")
    out, req = paused(team)
    assert req.member_run_id is not None
    # The cancel reached the team and not yet its member (each run in a transaction of its own).
    assert inline.store.endings.cancel(inline.store.get_record(out.run_id)) is not None

    with pytest.raises(RunNotPausedError, match="cancelled team"):
        team.client.decide(out.run_id, req.id, Decision(kind="confirm"))
    clock.advance(31)
    assert not inline.sweep()
    assert inline.store.get_record(req.member_run_id).status == S.PAUSED and paid == []
