"""A deploy between a pause and its decision (`orchestrator.paused_tools`), run by the in-memory
dispatcher on a real SQLite store, with two definitions of one agent name registered one after
the other as two versions of its code: when the paused tool is gone, renamed, no longer flagged
for what was asked, or takes other arguments, a decision that would run the call (or answer it
as that tool) is refused at the door where the catalog's newest live definition tells, and stops
the run in ERROR in the worker where it does not, the decision kept for a continue after a
deploy that serves the tool as it was. A rejection is taken either way. Both databases, and the
decision stored at once: tests/integration/test_decision_at_once.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine, update

from orchestrator import Agent, Decision, PausedToolChangedError, RunStatus, Team, Tool, tool
from orchestrator.catalog import live_seconds, write_served
from orchestrator.errors import DecisionKindError
from orchestrator.store import deciding
from orchestrator.store.tables import requirements
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from tests.support import Clock, CountingModel

S = RunStatus
CONFIRM = Decision(kind="confirm")


def version(
    agent_name: str, *tools: Tool, script: ScriptConfig | None = None, instructions: str | None = None
) -> Agent:
    """One version of the agent `agent_name`: every version is defined on this line, so each one
    replaces the one before in this process, as a deploy does on a worker."""
    return Agent(name=agent_name, model=CountingModel(script=script), tools=list(tools), instructions=instructions)


class Payments:
    """A `pay` tool that needs a confirmation, and what it paid."""

    def __init__(self) -> None:
        self.paid: list[tuple[int, str]] = []

        @tool(requires_confirmation=True)
        def pay(amount: int, to: str) -> str:
            """Pay someone."""
            self.paid.append((amount, to))
            return f"paid {amount} to {to}"

        self.pay = pay

    def with_a_memo(self) -> Tool:
        """`pay` taking another argument."""

        @tool(name="pay", requires_confirmation=True)
        def pay(amount: int, to: str, memo: str) -> str:
            """Pay someone, with a memo."""
            self.paid.append((amount, to))
            return "paid"

        return pay


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


#: What a deploy did to `pay`: the next version's tools, and what the refusal says of them.
CHANGES: dict[str, tuple[Callable[[Payments], list[Tool | Any]], str]] = {
    "removed": (lambda p: [lookup], "tool 'pay' is gone (removed, or renamed; the agent's tools: 'lookup')"),
    "renamed": (
        lambda p: [p.pay.with_flags(name="send_payment")],
        "tool 'pay' is gone, and 'send_payment' takes its arguments and asks the same (renamed?)",
    ),
    "flag dropped": (
        lambda p: [p.pay.with_flags(requires_confirmation=False)],
        "tool 'pay' now runs without asking anyone, where the run paused for a confirmation",
    ),
    "asks otherwise": (
        lambda p: [p.pay.with_flags(requires_confirmation=False, external_execution=True)],
        "tool 'pay' now is run by the caller (external execution), where the run paused for a confirmation",
    ),
    "arguments changed": (lambda p: [p.with_a_memo()], "tool 'pay' takes other arguments now"),
}


def name() -> str:
    return f"deployed-{uuid.uuid4().hex[:8]}"


def paused(inline: InMemoryDispatcher, agent: Agent) -> tuple[str, str]:
    """A run of `agent` paused on its first call; the run's id and the requirement's."""
    out = agent.run("pay bob")
    assert out.status == S.PAUSED, out.error
    [req] = out.active_requirements
    return out.run_id, req.id


def deployed(inline: InMemoryDispatcher, clock: Clock, agent: Agent) -> None:
    """The workers of the version that paused stopped and a worker of `agent`'s version booted:
    its catalog entry is the one live (with the old one live, a step would be handed on to it)."""
    clock.advance(live_seconds(inline.settings) + 1)
    write_served(inline.store, [agent])


@pytest.mark.parametrize("change", CHANGES)
def test_a_decision_on_a_tool_the_catalog_says_a_deploy_changed_is_refused_and_nothing_is_stored(
    inline: InMemoryDispatcher, clock: Clock, change: str
) -> None:
    payments, agent_name = Payments(), name()
    agent = version(agent_name, payments.pay)
    run_id, req_id = paused(inline, agent)
    tools, said = CHANGES[change]
    deployed(inline, clock, version(agent_name, *tools(payments)))

    with pytest.raises(PausedToolChangedError) as refused:
        agent.client.decide(run_id, req_id, CONFIRM, by="ann")

    message = str(refused.value)
    assert said in message and f"requirement {req_id} of run {run_id} was not decided" in message
    assert "Reject the call instead" in message and f"ratchet cancel {run_id}" in message
    assert isinstance(refused.value, DecisionKindError)
    run = agent.client.get_run(run_id)
    assert run.status == S.PAUSED and [r.status for r in run.requirements] == ["pending"]
    assert "decision" not in [e["kind"] for e in inline.store.get_events(run_id)] and payments.paid == []
    # A continue that carries the decision is refused alike
    [req] = run.active_requirements
    req.confirm()
    with pytest.raises(PausedToolChangedError):
        agent.continue_run(run_id=run_id, requirements=[req])


def test_a_rejection_is_taken_whatever_the_tool_became_and_the_model_reads_it(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    payments, agent_name = Payments(), name()
    agent = version(agent_name, payments.pay)
    run_id, req_id = paused(inline, agent)
    deployed(inline, clock, version(agent_name, lookup))

    agent.client.decide(run_id, req_id, Decision(kind="reject", note="not any more"))

    done = agent.client.get_run(run_id)
    assert done.status == S.COMPLETED and payments.paid == []
    assert [m.content for m in done.messages if m.role == "tool"] == ["not any more"]


def test_a_deploy_that_left_the_paused_tool_as_it_was_takes_the_decision(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    payments, agent_name = Payments(), name()
    agent = version(agent_name, payments.pay)
    run_id, req_id = paused(inline, agent)
    # Another definition is live (its instructions changed), with `pay` described alike
    deployed(inline, clock, version(agent_name, payments.pay, instructions="Be brief."))

    agent.client.decide(run_id, req_id, CONFIRM)

    assert agent.client.get_run(run_id).status == S.COMPLETED and payments.paid == [(1, "pay bob")]


def test_an_external_result_for_an_external_tool_a_deploy_removed_is_refused_at_the_door(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    @tool(external_execution=True)
    def deploy(service: str) -> str:
        """Deploy a service (the caller runs it)."""
        raise AssertionError("an external call is never run here")

    agent_name = name()
    agent = version(agent_name, deploy)
    run_id, req_id = paused(inline, agent)
    deployed(inline, clock, version(agent_name, lookup))

    with pytest.raises(PausedToolChangedError, match="tool 'deploy' is gone"):
        agent.client.decide(run_id, req_id, Decision(kind="result", result="deployed by CI"))
    assert agent.client.get_run(run_id).requirements[0].status == "pending"


@pytest.mark.parametrize("change", ["removed", "renamed", "flag dropped", "arguments changed"])
def test_a_worker_that_serves_the_paused_tool_changed_stops_the_run_in_error_and_keeps_the_decision(
    inline: InMemoryDispatcher, clock: Clock, change: str
) -> None:
    payments, agent_name = Payments(), name()
    agent = version(agent_name, payments.pay)
    run_id, req_id = paused(inline, agent)
    tools, said = CHANGES[change]
    # Given a deploy the catalog does not know of yet: its worker has not written it, and the
    # workers of the version that paused are gone (else the step would be handed on to them)
    version(agent_name, *tools(payments))
    clock.advance(live_seconds(inline.settings) + 1)

    stored = agent.client.decide(run_id, req_id, CONFIRM, by="ann")  # the run resumes on the new worker

    assert stored.status == "decided"
    failed = agent.client.get_run(run_id)
    assert failed.status == S.ERROR and failed.error is not None and payments.paid == []
    assert failed.error.type == "PausedToolChangedError"
    assert said in failed.error.message and f"requirement {req_id}" in failed.error.message
    assert "stays stored" in failed.error.message and f"ratchet continue {run_id}" in failed.error.message
    assert [(r.status, r.decision) for r in failed.requirements] == [("decided", CONFIRM)]
    # When a deploy serves the tool as it was again, a continue applies the decision kept
    version(agent_name, payments.pay)
    clock.advance(live_seconds(inline.settings) + 1)  # the workers of the version before are gone
    done = agent.continue_run(run_id=run_id)
    assert done.run_id == run_id and done.status == S.COMPLETED
    assert payments.paid == [(1, "pay bob")]


def test_a_persons_input_for_fields_a_deploy_changed_is_not_applied_by_the_worker(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    sent: list[tuple[str, str]] = []

    @tool(requires_user_input=True, user_input_fields=["recipient"])
    def send_mail(subject: str, recipient: str) -> str:
        """Send a mail."""
        sent.append((subject, recipient))
        return "sent"

    agent_name = name()
    agent = version(agent_name, send_mail)
    run_id, req_id = paused(inline, agent)
    version(agent_name, send_mail.with_flags(user_input_fields=["subject", "recipient"]))
    clock.advance(live_seconds(inline.settings) + 1)  # the workers of the version before are gone

    agent.client.decide(run_id, req_id, Decision(kind="input", values={"recipient": "ann@example.com"}))

    failed = agent.client.get_run(run_id)
    assert failed.status == S.ERROR and failed.error is not None and sent == []
    assert "tool 'send_mail' takes other arguments now" in failed.error.message


def test_a_requirement_written_before_tools_were_recorded_is_compared_by_name_and_flag(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    payments, agent_name = Payments(), name()
    agent = version(agent_name, payments.pay)
    run_id, req_id = paused(inline, agent)
    with inline.store.engine.begin() as conn:
        conn.execute(
            update(requirements).where(requirements.c.id == req_id).values(definition_hash=None, tool_digest=None)
        )
    # Other arguments are not seen (nothing recorded to compare with); a dropped flag is
    version(agent_name, payments.pay.with_flags(requires_confirmation=False))
    clock.advance(live_seconds(inline.settings) + 1)  # the workers of the version before are gone

    agent.client.decide(run_id, req_id, CONFIRM)

    failed = agent.client.get_run(run_id)
    assert failed.status == S.ERROR and failed.error is not None and payments.paid == []
    assert "tool 'pay' now runs without asking anyone" in failed.error.message


def test_a_members_decision_sent_through_its_team_is_checked_against_the_members_definition(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    payments, member_name = Payments(), name()
    calls = [{"tool": "pay", "arguments": {"amount": 5, "to": "ann"}}]
    member = version(member_name, payments.pay, script=ScriptConfig(batches=[calls], final_text="{tool_results}"))
    delegate = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "pay ann"}}
    lead = CountingModel(script=ScriptConfig(batches=[[delegate]], final_text="{tool_results}"))
    team = Team(name=name(), model=lead, members=[member])
    out = team.run("pay ann")
    assert out.status == S.PAUSED
    [req] = out.active_requirements
    deployed(inline, clock, version(member_name, lookup))

    with pytest.raises(PausedToolChangedError, match=f"agent '{member_name}'.*tool 'pay' is gone"):
        team.client.decide(out.run_id, req.id, CONFIRM)
    assert team.client.get_run(out.run_id).status == S.PAUSED and payments.paid == []


def test_the_decision_statement_stays_short_enough_for_psycopg_to_keep_its_parse() -> None:
    # psycopg parses a statement again on every call past 4096 bytes or 50 parameters
    compiled = deciding.DECIDE_PG.compile(dialect=create_engine("postgresql+psycopg://").dialect)
    assert len(compiled.string.encode()) <= 4096 and len(compiled.params) <= 50
