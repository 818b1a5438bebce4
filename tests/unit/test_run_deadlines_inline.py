"""A run's deadline (`run_timeout=`), run by the in-memory dispatcher on a real SQLite store with a
clock the test moves: stopped by a sweeper pass (no continue, no worker) whether it is QUEUED and
never taken, PAUSED for a person, mid model call or mid tool batch (its writes fenced, what it
committed before kept), a team with its members; ERROR with RunTimeoutError, and a continue that
goes on with the deadline given again; the agent's default, the checks at the door, a start sent
again. A real worker's sweeper and a held model call: tests/integration/test_run_deadline_workers.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta

import pytest

from orchestrator import (
    Agent,
    ConfigurationError,
    Decision,
    DecisionExpiredError,
    InvalidInputError,
    RunBusyError,
    RunConflictError,
    RunNotPausedError,
    RunOutput,
    RunStatus,
    Team,
    tool,
)
from orchestrator.messages import Message
from orchestrator.models.base import CallContext, ModelReply, ToolSpec
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.waiting import wait_until
from tests.support import Clock, CountingModel

S = RunStatus


def name() -> str:
    return f"deadline-run-{uuid.uuid4().hex[:8]}"


class DuringCall(CountingModel):
    """The scripted model, running `during` once inside its next call (the step holds its claim,
    nothing of the call is committed yet)."""

    def __init__(self, script: ScriptConfig | None = None) -> None:
        super().__init__(script=script)
        self.during: Callable[[], None] | None = None

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        hook, self.during = self.during, None
        if hook is not None:
            hook()
        return super().invoke(messages, tools, context=context)


def kinds(inline: InMemoryDispatcher, run_id: str) -> list[str]:
    return [e["kind"] for e in inline.store.get_events(run_id)]


def timed_out(out: RunOutput) -> bool:
    return out.status == S.ERROR and out.error is not None and out.error.type == "RunTimeoutError"


def test_a_queued_run_is_stopped_at_its_deadline_by_a_sweep_and_no_worker_takes_it_after(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    inline.autorun = False  # the run waits QUEUED for a worker that never comes
    model = CountingModel()
    agent = Agent(name=name(), model=model)
    run_id = agent.start("hi", run_timeout=60).run_id
    record = inline.store.get_record(run_id)
    assert record.deadline_at == pytest.approx(record.created_at + 60) and record.run_timeout == 60

    clock.advance(59)
    assert not inline.sweep() and inline.store.get_record(run_id).status == S.QUEUED  # not yet
    clock.advance(2)
    assert inline.run_next() is not None  # its step, delivered past the deadline: not claimed
    assert model.calls == [] and inline.store.get_record(run_id).status == S.QUEUED

    report = inline.sweep()

    assert report.stopped == [run_id] and not report.republished
    out = agent.client.get_run(run_id)
    assert timed_out(out) and out.error is not None
    for said in (run_id, "60s of run_timeout", "PAUSED time included", "Continue it"):
        assert said in out.error.message
    assert [m.role for m in out.messages] == ["user"]  # what it had, kept
    assert kinds(inline, run_id)[-1] == "error"
    assert not inline.sweep()  # once


def test_a_paused_run_is_stopped_at_its_deadline_and_a_continue_gives_it_its_timeout_again(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    paid: list[str] = []

    @tool(requires_confirmation=True)
    def pay(to: str) -> str:
        """Pay someone."""
        paid.append(to)
        return f"paid {to}"

    agent = Agent(name=name(), model=CountingModel(), tools=[pay], run_timeout=60)
    out = agent.run("pay bob")
    assert out.status == S.PAUSED and out.deadline_at is not None and out.run_timeout == 60
    [req] = out.active_requirements
    clock.advance(61)  # PAUSED time counts: nobody decided, nobody continued

    assert inline.sweep().stopped == [out.run_id]
    failed = agent.client.get_run(out.run_id)
    assert timed_out(failed) and [r.status for r in failed.requirements] == ["expired"]
    with pytest.raises(DecisionExpiredError, match="the run's own run_timeout"):
        agent.client.decide(out.run_id, req.id, Decision(kind="confirm"))

    agent.client.continue_run(out.run_id)  # the call pauses again, under a deadline from now
    again = agent.client.get_run(out.run_id)
    assert again.status == S.PAUSED and again.deadline_at == pytest.approx(clock() + 60, abs=1)
    [new] = again.active_requirements
    new.confirm()
    done = agent.continue_run(run_id=out.run_id, requirements=[new])
    assert done.status == S.COMPLETED and paid == ["pay bob"]


def test_a_model_call_in_flight_at_the_deadline_is_fenced_and_commits_nothing(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    model = DuringCall()
    agent = Agent(name=name(), model=model)
    stops: list[list[str]] = []

    def deadline_passes() -> None:  # a sweep while the call is in flight
        clock.advance(31)
        stops.append(inline.sweep().stopped)

    model.during = deadline_passes
    out = agent.run("hi", run_timeout=30)

    assert stops == [[out.run_id]] and len(model.calls) == 1  # the call was made, its reply dropped
    assert timed_out(out) and [m.role for m in out.messages] == ["user"]
    assert kinds(inline, out.run_id)[-2:] == ["error", "fenced"]  # stopped, then its commit refused

    done = agent.continue_run(run_id=out.run_id)
    assert done.status == S.COMPLETED and len(model.calls) == 2


def test_a_tool_batch_in_flight_keeps_the_results_it_committed_and_a_continue_runs_only_the_rest(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    ran: list[str] = []
    run: dict[str, str] = {}

    def first() -> str:
        """The first call: done before the deadline."""
        ran.append("first")
        return "first done"

    def second() -> str:
        """The second call: in flight when the deadline passes."""
        ran.append("second")
        if ran.count("second") == 1:
            wait_until(
                lambda: any(m.content == "first done" for m in inline.store.get_messages(run["id"])),
                timeout=30,
                what="the first call's result to be committed",
            )
            clock.advance(31)
            inline.sweep()
        return "second done"

    calls = [{"tool": "first", "arguments": {}}, {"tool": "second", "arguments": {}}]
    agent = Agent(name=name(), model=CountingModel(script=ScriptConfig(batches=[calls])), tools=[first, second])
    inline.autorun = False
    run["id"] = agent.start("both", run_timeout=30).run_id
    inline.run_until_idle()

    out = agent.client.get_run(run["id"])
    assert timed_out(out) and sorted(ran) == ["first", "second"]
    assert [m.content for m in out.messages if m.role == "tool"] == ["first done"]  # its result only
    assert "fenced" in kinds(inline, run["id"])

    inline.autorun = True
    done = agent.continue_run(run_id=run["id"])
    assert done.status == S.COMPLETED and sorted(ran) == ["first", "second", "second"]  # first not again
    assert sorted(m.content or "" for m in done.messages if m.role == "tool") == ["first done", "second done"]


def test_an_at_most_once_call_in_flight_at_the_deadline_is_not_run_again_by_a_continue(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    charged: list[int] = []

    @tool(at_most_once=True)
    def charge(amount: int) -> str:
        """Charge a card."""
        charged.append(amount)
        clock.advance(31)
        inline.sweep()  # the deadline passes while the charge is being made
        return "charged"

    agent = Agent(name=name(), model=CountingModel(), tools=[charge])
    out = agent.run("charge 5", run_timeout=30)
    assert timed_out(out) and len(charged) == 1

    interrupted = agent.continue_run(run_id=out.run_id)  # as after a worker died mid-call: not run again
    assert interrupted.error is not None and interrupted.error.type == "ToolInterruptedError" and len(charged) == 1
    done = agent.continue_run(run_id=out.run_id)
    assert done.status == S.COMPLETED and len(charged) == 1
    [result] = [m for m in done.messages if m.role == "tool"]
    assert result.tool_call_error and "unknown" in (result.content or "")


def test_a_teams_deadline_stops_its_members_with_it_and_continuing_the_team_goes_on(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    @tool(requires_confirmation=True)
    def pay(to: str) -> str:
        """Pay someone."""
        return f"paid {to}"

    payer = Agent(name=name(), model=CountingModel(), tools=[pay], role="Pays.", run_timeout=5)
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(payer), "task": "pay ann"}}
    leader = CountingModel(script=ScriptConfig(batches=[[call]], final_text="Team: {tool_results}"))
    team = Team(name=name(), model=leader, members=[payer], run_timeout=120)
    out = team.run("pay ann")
    [member] = out.member_runs
    assert out.status == S.PAUSED and member.status == S.PAUSED
    assert member.deadline_at is None  # a member's own agent's run_timeout is not its: the team's covers it
    clock.advance(60)
    assert not inline.sweep().stopped
    clock.advance(61)

    assert inline.sweep().stopped == [out.run_id]
    failed = team.client.get_run(out.run_id)
    [member] = failed.member_runs
    assert timed_out(failed) and timed_out(member) and member.error is not None
    assert f"with its team's run {out.run_id}" in member.error.message
    assert kinds(inline, member.run_id)[-1] == "error"

    team.client.continue_run(out.run_id)  # the member in place, then the leader waits again
    resumed = team.client.get_run(out.run_id)
    assert resumed.status == S.PAUSED and resumed.deadline_at == pytest.approx(clock() + 120, abs=1)
    [member] = resumed.member_runs
    [new] = member.active_requirements
    team.client.decide(member.run_id, new.id, Decision(kind="confirm"))
    assert team.client.wait(out.run_id).status == S.COMPLETED


def test_a_decision_after_the_teams_deadline_is_refused_for_its_member_until_the_sweep_stops_them(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    @tool(requires_confirmation=True)
    def pay(to: str) -> str:
        """Pay someone."""
        return f"paid {to}"

    payer = Agent(name=name(), model=CountingModel(), tools=[pay], role="Pays.")
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(payer), "task": "pay ann"}}
    leader = CountingModel(script=ScriptConfig(batches=[[call]], final_text="Team: {tool_results}"))
    team = Team(name=name(), model=leader, members=[payer], run_timeout=120)
    out = team.run("pay ann")
    [member] = out.member_runs
    [req] = member.active_requirements
    clock.advance(121)  # past the team's deadline, before any sweep

    with pytest.raises(DecisionExpiredError, match=f"run {out.run_id} passed its deadline"):
        team.client.decide(member.run_id, req.id, Decision(kind="confirm"))
    assert [r.status for r in team.client.get_run(member.run_id).requirements] == ["pending"]
    assert "decision" not in kinds(inline, member.run_id)

    assert inline.sweep().stopped == [out.run_id]
    assert timed_out(team.client.get_run(out.run_id)) and timed_out(team.client.get_run(member.run_id))


def test_past_the_runs_deadline_a_decision_is_refused_for_the_deadline_that_holds(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    @tool(requires_confirmation=True)
    def pay(to: str) -> str:
        """Pay someone."""
        return f"paid {to}"

    agent = Agent(name=name(), model=CountingModel(), tools=[pay], run_timeout=60, pause_timeout=30)
    out = agent.run("pay bob")
    [req] = out.active_requirements
    cancelled = Agent(name=name(), model=CountingModel(), tools=[pay], run_timeout=60).run("pay ann")
    [gone] = cancelled.active_requirements
    agent.client.cancel(cancelled.run_id)
    clock.advance(61)  # past the pause's deadline and the run's: the sweep stops the run first
    grace = inline.settings.publish_grace_seconds

    with pytest.raises(DecisionExpiredError, match=f"run {out.run_id} passed its deadline"):
        agent.client.decide(out.run_id, req.id, Decision(kind="confirm"))
    with pytest.raises(DecisionExpiredError, match=f"run {out.run_id} passed its deadline"):  # the pause's own too
        inline.store.requirements.decide(
            out.run_id, req.id, Decision(kind="reject"), by=None, publish_grace=grace, at_deadline=True
        )
    assert "resume" not in kinds(inline, out.run_id) and "decision" not in kinds(inline, out.run_id)
    with pytest.raises(RunNotPausedError):  # a run that is not PAUSED any more is that, whatever its deadline
        agent.client.decide(cancelled.run_id, gone.id, Decision(kind="confirm"))


def test_a_continue_keeps_a_deadline_ahead_takes_a_new_one_and_refuses_one_for_a_run_going_on(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    failing = ScriptConfig(faults=[Fault(status=400, turn=1)])
    agent = Agent(name=name(), model=CountingModel(script=failing), run_timeout=600)
    out = agent.run("hi")
    assert out.status == S.ERROR and out.deadline_at is not None

    clock.advance(100)
    inline.autorun = False
    agent.client.continue_run(out.run_id)  # its deadline is ahead: kept
    assert inline.store.get_record(out.run_id).deadline_at == out.deadline_at
    with pytest.raises(RunBusyError, match="its deadline was not changed"):
        agent.client.continue_run(out.run_id, run_timeout=30)  # QUEUED: going on as it is
    inline.autorun = True
    inline.run_until_idle()
    done = agent.client.get_run(out.run_id)
    assert done.status == S.COMPLETED

    same = agent.client.wait(agent.client.continue_run(out.run_id, input="more").run_id)
    assert same.forked_from == out.run_id and same.run_timeout == 600  # a fork: its source's run_timeout
    forked = agent.client.wait(
        agent.client.continue_run(out.run_id, input="again", run_timeout=timedelta(minutes=2)).run_id
    )
    assert forked.forked_from == out.run_id and forked.run_timeout == 120
    assert forked.deadline_at == pytest.approx(forked.created_at + 120)


def test_a_run_whose_last_step_commits_after_its_deadline_before_a_sweep_is_completed(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    model = DuringCall()
    model.during = lambda: clock.advance(6)  # the deadline passes mid call (its lease lives), no sweep comes
    out = Agent(name=name(), model=model).run("hi", run_timeout=5)
    assert out.status == S.COMPLETED and inline.store.clock() > (out.deadline_at or 0)
    assert not inline.sweep().stopped


def test_a_starts_run_timeout_wins_over_its_agents_and_is_checked_at_the_door(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name(), model=CountingModel(), run_timeout=3600)
    assert agent.client.get_run(agent.start("hi").run_id).run_timeout == 3600
    assert agent.client.get_run(agent.start("hi", run_timeout="90s").run_id).run_timeout == 90  # type: ignore[arg-type]
    assert Agent(name=name(), model=CountingModel()).run("hi").deadline_at is None

    for bad in (0, -1, float("nan"), float("inf"), True, "soon", 367 * 86400):
        with pytest.raises(InvalidInputError, match="run_timeout"):
            agent.start("hi", run_timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="run_timeout"):
        Agent(name=name(), model=CountingModel(), run_timeout=0)

    run_id = f"again-{uuid.uuid4().hex[:8]}"
    agent.start("hi", run_id=run_id, run_timeout=60)
    assert agent.start("hi", run_id=run_id).run_id == run_id  # the same start: the run's run_timeout
    assert agent.start("hi", run_id=run_id, run_timeout=60).run_id == run_id
    with pytest.raises(RunConflictError, match="run_timeout=60.0"):
        agent.start("hi", run_id=run_id, run_timeout=61)


def test_the_catalog_carries_an_agents_run_timeout_to_producers_that_do_not_import_it(
    inline: InMemoryDispatcher,
) -> None:
    from orchestrator import catalog

    agent = Agent(name=name(), model=CountingModel(), run_timeout=45, max_queued=7)
    described = catalog.describe(agent)
    assert (described.run_timeout, described.max_queued) == (45, 7)
    assert "run_timeout" not in catalog.describe(Agent(name=name(), model=CountingModel())).body()  # hash as before
    # A definition only a worker serves (this process does not define it), live in the catalog
    served = catalog.Definition.from_body({**described.body(), "name": name()})
    inline.store.catalog.write([served.served()])
    inline.autorun = False

    record = inline.store.get_record(inline.client.start(served.name, input="hi").run_id)

    assert record.run_timeout == 45 and record.definition_hash == served.hash
