"""A person in the loop, as a reader of the run sees it: RunPaused with what the pause asks,
RunRequirementDecided for each decision (who, when, what), RunContinued when the last one queues
the run again; a stream that ends at PAUSED and one opened after the decisions that gets exactly
the rest; the timeline's wait for a person; `ratchet show` and `ratchet stream`'s lines. Run by the
in-memory dispatcher on a real SQLite store whose clock the test moves. The same on real workers
and PostgreSQL: tests/integration/test_hitl_workers.py; the metrics: test_prometheus_metrics.py."""

from __future__ import annotations

import uuid

from orchestrator import Agent, Decision, RunEvent, RunStatus, Team, tool
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from tests.support import Clock, CountingModel
from workers.cli.render import describe, step_line

S = RunStatus


def name() -> str:
    return f"hitl-ev-{uuid.uuid4().hex[:8]}"


@tool(requires_confirmation=True)
def pay(amount: int, to: str) -> str:
    """Pay someone.

    Args:
        amount: In cents.
        to: Who is paid.
    """
    return f"paid {amount} to {to}"


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


BATCH = ScriptConfig(
    batches=[
        [
            {"tool": "pay", "arguments": {"amount": 5, "to": "ann"}},
            {"tool": "pay", "arguments": {"amount": 7, "to": "bob"}},
            {"tool": "lookup", "arguments": {"query": "rates"}},
        ]
    ]
)


def names(events: list[RunEvent]) -> list[str]:
    return [e.event for e in events]


def durable(events: list[RunEvent]) -> list[RunEvent]:
    """The events but the text deltas (a run started with stream=True streams its steps after a
    resume too)."""
    return [e for e in events if e.event != "RunContent"]


def test_a_stream_ends_at_the_pause_and_one_opened_after_each_decision_gets_exactly_the_rest(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    agent = Agent(name=name(), model=CountingModel(script=BATCH), tools=[pay, lookup])

    # The run's own stream ends at PAUSED, its last event the pause with both paused calls
    first = list(agent.run("pay them", stream=True))
    paused = first[-1]
    run_id = paused.run_id
    assert names(first) == ["RunStarted", *["ToolCallStarted"] * 3, "ToolCallCompleted", "RunPaused"]
    assert first[-2].tool is not None and first[-2].tool.result == "found rates"  # the batch's other call ran
    assert paused.status == "PAUSED" and paused.requirements is not None
    ann, bob = paused.requirements
    assert [r.tool_execution.tool_args for r in (ann, bob) if r.tool_execution] == [
        {"amount": 5, "to": "ann"},
        {"amount": 7, "to": "bob"},
    ]
    assert {r.pause_type for r in (ann, bob)} == {"confirmation"} and all(r.is_active for r in (ann, bob))
    client = agent.client

    # One decision: a reader that stopped at the pause gets it, and stops again (still PAUSED)
    clock.advance(30)
    client.decide(run_id, ann.id, Decision(kind="confirm"), by="ann@ops")
    [decided] = list(client.stream(run_id, after=paused.id))
    assert decided.event == "RunRequirementDecided" and decided.requirement is not None
    assert decided.requirement.id == ann.id and decided.requirement.decided_by == "ann@ops"
    assert decided.requirement.decision == Decision(kind="confirm")
    assert decided.requirement.decided_at is not None  # when: the clock moved 30 s since the pause
    assert 30 <= decided.requirement.decided_at - paused.created_at < 31
    assert 0 <= decided.created_at - decided.requirement.decided_at < 1
    assert client.get_run(run_id).status == S.PAUSED

    # The last decision resumes the run: the rest, from the decision on, in order
    clock.advance(90)
    client.decide(run_id, bob.id, Decision(kind="reject", note="not bob"), by="bob@ops")
    rest = durable(list(client.stream(run_id, after=decided.id)))
    assert names(rest) == [
        "RunRequirementDecided",
        "RunContinued",
        "ToolCallCompleted",
        "ToolCallCompleted",
        "RunCompleted",
    ]
    rejected, continued = rest[0], rest[1]
    assert rejected.requirement is not None and rejected.requirement.decision == Decision(kind="reject", note="not bob")
    assert continued.status == "QUEUED" and continued.created_at >= rejected.created_at
    results = {e.tool.tool_args["to"]: e.tool for e in rest if e.tool is not None and e.tool.tool_args}
    assert results["bob"].tool_call_error and results["bob"].result == "not bob"
    assert results["ann"].result == "paid 5 to ann"

    # Read again from the start: the same events, the pause still as it asked (pending, undecided)
    again = durable(list(client.stream(run_id)))
    assert again == [*first, decided, *rest]
    assert again[len(first) - 1].requirements == paused.requirements


def test_the_timeline_shows_the_wait_for_a_person_from_the_pause_to_the_resume_with_its_decisions(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    agent = Agent(name=name(), model=CountingModel(script=BATCH), tools=[pay, lookup])
    out = agent.run("pay them")
    client = agent.client
    [waiting] = [s for s in client.get_steps(out.run_id) if s.task == "decision"]
    assert waiting.status == "paused" and waiting.asked == 2 and waiting.decisions == ()
    assert waiting.ended_at is None and waiting.duration is None and waiting.worker is None
    log = {e.kind: e for e in client.get_log(out.run_id)}
    assert waiting.ready_at == log["paused"].at
    assert log["paused"].detail is not None and sorted(log["paused"].detail["requirements"]) == sorted(
        r.id for r in out.requirements
    )

    ann, bob = out.active_requirements
    clock.advance(40)
    client.decide(out.run_id, ann.id, Decision(kind="confirm"), by="ann@ops")
    clock.advance(80)
    client.decide(out.run_id, bob.id, Decision(kind="reject"), by="bob@ops")
    assert client.get_run(out.run_id).status == S.COMPLETED

    steps = client.get_steps(out.run_id)
    assert [(s.seq, s.task, s.status) for s in steps] == [
        (0, "model", "done"),
        (1, "tools", "done"),  # the batch's other call, then the pause
        (2, "decision", "done"),
        (2, "tools", "done"),  # the decided calls, once the run resumed
        (3, "model", "done"),
    ]
    wait, resumed = steps[2], steps[3]
    log = {e.kind: e for e in client.get_log(out.run_id)}
    assert wait.ended_at == log["resume"].at and resumed.ready_at == log["resume"].at
    assert wait.duration is not None and 120 <= wait.duration < 121  # the time to decision
    assert [(d.requirement, d.by, d.decision) for d in wait.decisions] == [
        (ann.id, "ann@ops", "confirm"),
        (bob.id, "bob@ops", "reject"),
    ]
    line = step_line(wait)  # `ratchet show --steps`
    assert line.startswith("step 2  decision  done") and "asked 2, decided 2" in line
    assert "confirm by ann@ops" in line and "reject by bob@ops" in line


def test_a_pause_on_every_call_of_a_batch_shows_the_batch_that_paused(inline: InMemoryDispatcher) -> None:
    script = ScriptConfig(batches=[[{"tool": "pay", "arguments": {"amount": 5, "to": "ann"}}]])
    agent = Agent(name=name(), model=CountingModel(script=script), tools=[pay])
    out = agent.run("pay ann")

    steps = agent.client.get_steps(out.run_id)
    assert [(s.seq, s.task, s.status, s.messages) for s in steps] == [
        (0, "model", "done", 1),
        (1, "tools", "done", 0),  # it wrote nothing: every call waits for a person
        (2, "decision", "paused", 0),
    ]


def test_the_stream_lines_of_ratchet_stream_name_what_was_asked_and_who_decided(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name(), model=CountingModel(script=BATCH), tools=[pay, lookup])
    out = agent.run("pay them")
    ann, bob = out.active_requirements
    agent.client.decide(out.run_id, ann.id, Decision(kind="confirm"), by="ann@ops")
    agent.client.decide(out.run_id, bob.id, Decision(kind="reject", note="no"))
    lines = {e.event: describe(e) for e in agent.client.stream(out.run_id) if e.event != "RunRequirementDecided"}
    decided = [describe(e) for e in agent.client.stream(out.run_id) if e.event == "RunRequirementDecided"]

    assert f'confirmation {ann.id} pay({{"amount": 5, "to": "ann"}})' in lines["RunPaused"]
    assert f"confirmation {bob.id} pay(" in lines["RunPaused"]
    assert decided[0].endswith(": confirm by ann@ops")
    assert decided[1].endswith(": reject ('no') by an unnamed decider")


def test_a_team_streams_its_members_pause_and_the_member_streams_the_decision(inline: InMemoryDispatcher) -> None:
    script = ScriptConfig(batches=[[{"tool": "pay", "arguments": {"amount": 5, "to": "ann"}}]])
    payer = Agent(name=name(), model=CountingModel(script=script), tools=[pay], role="Pays.")
    delegate = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(payer), "task": "pay ann"}}
    team = Team(name=name(), model=CountingModel(script=ScriptConfig(batches=[[delegate]])), members=[payer])

    out = team.run("pay ann")
    assert out.status == S.PAUSED
    [req] = out.active_requirements
    paused = list(team.client.stream(out.run_id))[-1]
    assert paused.event == "RunPaused" and paused.requirements is not None
    [asked] = paused.requirements
    assert asked.id == req.id and asked.member_run_id == req.run_id and asked.member_agent_name == payer.name

    team.client.decide(out.run_id, req.id, Decision(kind="confirm"), by="ann@ops")
    assert team.client.get_run(out.run_id).status == S.COMPLETED
    after = list(team.client.stream(out.run_id, after=paused.id))
    assert names(after)[:2] == ["RunContinued", "MemberRunCompleted"] and after[0].status == "WAITING"
    member = list(team.client.stream(req.run_id))
    assert "RunRequirementDecided" in names(member)
    [decided] = [e for e in member if e.requirement is not None]
    assert decided.requirement is not None and decided.requirement.decided_by == "ann@ops"
