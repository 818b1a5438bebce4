"""A person in the loop, run by the in-memory dispatcher on a real SQLite store: tools that pause
a run (confirmation, a person's input, an external result), decisions stored one by one and
resuming the run by themselves, and every decision that must be refused. Real workers and
PostgreSQL run the same in tests/integration/test_hitl_workers.py."""

from __future__ import annotations

import json
import uuid

import pytest
from sqlalchemy import update

from orchestrator import (
    Agent,
    Decision,
    DecisionConflictError,
    DecisionKindError,
    RequirementNotFoundError,
    RunNotPausedError,
    RunStatus,
    Toolkit,
    tool,
)
from orchestrator.catalog import describe
from orchestrator.errors import ConfigurationError, RunBusyError
from orchestrator.store.tables import runs
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from tests.support import CountingModel

S = RunStatus


def name() -> str:
    return f"hitl-{uuid.uuid4().hex[:8]}"


def payments() -> tuple[list[tuple[int, str]], object]:
    paid: list[tuple[int, str]] = []

    @tool(requires_confirmation=True)
    def pay(amount: int, to: str) -> str:
        """Pay someone.

        Args:
            amount: In cents.
            to: Who is paid.
        """
        paid.append((amount, to))
        return f"paid {amount} to {to}"

    return paid, pay


def test_a_confirmed_call_runs_once_when_the_run_resumes_under_the_same_run_id(inline: InMemoryDispatcher) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay])

    out = agent.run("pay bob")

    assert out.status == S.PAUSED and out.is_paused and paid == []
    [req] = out.active_requirements
    assert req.pause_type == "confirmation" and req.needs_confirmation
    assert req.tool_execution is not None and req.tool_execution.tool_name == "pay"
    assert inline.store.get_record(out.run_id).lease_owner is None  # nothing held while PAUSED
    req.confirm()
    done = agent.continue_run(run_id=out.run_id, requirements=[req])

    assert done.run_id == out.run_id and done.status == S.COMPLETED
    assert paid == [(1, "pay bob")]
    assert [r.status for r in done.requirements] == ["decided"] and done.active_requirements == []
    kinds = [e["kind"] for e in inline.store.get_events(out.run_id)]
    assert kinds.count("paused") == 1 and kinds.count("decision") == 1 and kinds.count("resume") == 1


def test_a_rejected_call_is_not_run_and_the_model_reads_the_note(inline: InMemoryDispatcher) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay])
    out = agent.run("pay bob")

    out.requirements[0].reject(note="not this month")
    done = agent.continue_run(out)

    assert done.status == S.COMPLETED and paid == []
    [result] = [m for m in done.messages if m.role == "tool"]
    assert result.content == "not this month" and result.tool_call_error
    assert done.content == "Summary: not this month"  # what the model read


def test_the_fields_a_person_fills_in_leave_the_models_schema_and_the_call_runs_with_them(
    inline: InMemoryDispatcher,
) -> None:
    sent: list[tuple[str, str]] = []

    @tool(requires_user_input=True, user_input_fields=["recipient"])
    def send_mail(subject: str, recipient: str) -> str:
        """Send a mail."""
        sent.append((subject, recipient))
        return "sent"

    assert set(send_mail.spec.parameters["properties"]) == {"subject"}
    assert send_mail.spec.parameters["required"] == ["subject"]
    agent = Agent(name=name(), model=CountingModel(), tools=[send_mail])
    out = agent.run("mail it")
    [req] = out.active_requirements
    assert req.pause_type == "user_input" and [f["name"] for f in req.user_input_schema or []] == ["recipient"]

    with pytest.raises(DecisionKindError, match="missing"):
        req.provide_user_input({})
    req.provide_user_input({"recipient": "ann@example.com"})
    done = agent.continue_run(out)

    assert done.status == S.COMPLETED and sent == [("mail it", "ann@example.com")]
    assert done.requirements[0].user_input_schema == [
        {"name": "recipient", "type": "string", "description": None, "value": "ann@example.com"}
    ]


def test_an_external_call_is_never_run_here_and_the_model_reads_the_callers_result(inline: InMemoryDispatcher) -> None:
    ran: list[str] = []

    @tool(external_execution=True)
    def deploy(service: str) -> str:
        """Deploy a service."""
        ran.append(service)
        return "deployed here"

    agent = Agent(name=name(), model=CountingModel(), tools=[deploy])
    out = agent.run("ship it")
    [req] = out.active_requirements
    assert req.needs_external_execution
    with pytest.raises(DecisionKindError, match="external execution"):
        req.confirm()
    req.set_external_execution_result("deployed by CI, build 42")
    done = agent.continue_run(out)

    assert ran == [] and done.status == S.COMPLETED
    assert done.content == "Summary: deployed by CI, build 42"


def test_decisions_come_one_at_a_time_and_the_last_one_resumes_the_run(inline: InMemoryDispatcher) -> None:
    paid, pay = payments()

    @tool(requires_confirmation=True)
    def refund(amount: int) -> str:
        """Refund."""
        paid.append((-amount, "refund"))
        return "refunded"

    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        return f"found {query}"

    script = ScriptConfig(
        batches=[
            [
                {"tool": "pay", "arguments": {"amount": 5, "to": "ann"}},
                {"tool": "refund", "arguments": {"amount": 2}},
                {"tool": "lookup", "arguments": {"query": "do it all"}},
            ]
        ]
    )
    agent = Agent(name=name(), model=CountingModel(script=script), tools=[pay, refund, lookup])
    out = agent.run("do it all")
    assert out.status == S.PAUSED and len(out.active_requirements) == 2
    # The batch's other call ran and was committed before the run paused.
    assert [m.content for m in out.messages if m.role == "tool"] == ["found do it all"]
    first, second = out.active_requirements
    client = agent.client

    client.decide(out.run_id, first.id, Decision(kind="confirm"), by="ann")
    assert client.get_run(out.run_id).status == S.PAUSED and paid == []
    client.decide(out.run_id, second.id, Decision(kind="reject"), by="bob")

    done = client.wait(out.run_id)
    assert done.status == S.COMPLETED and len(paid) == 1
    assert {r.decided_by for r in done.requirements} == {"ann", "bob"}


def test_a_decision_sent_twice_is_a_no_op_and_another_decision_says_who_decided_first(
    inline: InMemoryDispatcher,
) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay])
    out = agent.run("pay bob")
    req = out.requirements[0]
    client = agent.client

    client.decide(out.run_id, req.id, Decision(kind="confirm"), by="ann")
    again = client.decide(out.run_id, req.id, Decision(kind="confirm"), by="ann")
    assert again.status == "decided" and paid == [(1, "pay bob")]
    with pytest.raises(DecisionConflictError, match="by ann") as refused:
        client.decide(out.run_id, req.id, Decision(kind="reject"), by="bob")
    assert refused.value.decided_by == "ann"
    assert len(paid) == 1


def test_a_decision_for_an_unknown_id_a_run_not_paused_or_of_the_wrong_kind_is_refused(
    inline: InMemoryDispatcher,
) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay])
    other = Agent(name=name(), model=CountingModel()).run("hello")
    out = agent.run("pay bob")
    client = agent.client
    req = out.requirements[0]

    with pytest.raises(RequirementNotFoundError):
        client.decide(out.run_id, "no-such-requirement", Decision(kind="confirm"))
    with pytest.raises(RequirementNotFoundError):  # another run's id does not reach this one's requirement
        client.decide(other.run_id, req.id, Decision(kind="confirm"))
    with pytest.raises(DecisionKindError, match="asks for confirmation"):
        client.decide(out.run_id, req.id, Decision(kind="input", values={"to": "x"}))
    with pytest.raises(RunBusyError, match="PAUSED"):
        client.continue_run(out.run_id, input="more")
    assert client.continue_run(out.run_id).run_id == out.run_id  # still waiting: a no-op
    assert client.get_run(out.run_id).status == S.PAUSED and paid == []

    cancelled = client.cancel(out.run_id)
    assert cancelled.active_requirements == [] and [r.status for r in cancelled.requirements] == ["void"]
    with pytest.raises(RunNotPausedError, match="CANCELLED"):
        client.decide(out.run_id, req.id, Decision(kind="confirm"))
    assert paid == []


def test_a_decision_from_outside_is_checked_before_it_is_stored() -> None:
    with pytest.raises(DecisionKindError, match="kind"):
        Decision.from_json({"kind": "approve"})
    with pytest.raises(DecisionKindError, match="unknown fields"):
        Decision.from_json({"kind": "confirm", "by": "me"})
    assert Decision.from_json({"kind": "reject", "note": "no"}) == Decision(kind="reject", note="no")


def test_a_toolkits_lists_flag_its_tools_and_the_flags_are_in_the_catalog() -> None:
    class Ops(Toolkit):
        def __init__(self) -> None:
            super().__init__(
                name="ops",
                tools=[self.restart, self.status, self.migrate],
                requires_confirmation_tools=["restart"],
                external_execution_required_tools=["migrate"],
            )

        def restart(self, service: str) -> str:
            """Restart a service."""
            return "restarted"

        def status(self, service: str) -> str:
            """A service's status."""
            return "ok"

        def migrate(self, version: str) -> str:
            """Migrate the database."""
            return "migrated"

    agent = Agent(name=name(), model=CountingModel(), tools=[Ops()], pause_timeout=3600, on_timeout="cancel")
    by_name = {t.name: t for t in agent.tools}
    assert by_name["restart"].pause_type == "confirmation"
    assert by_name["migrate"].pause_type == "external_execution" and by_name["status"].pause_type is None
    flags = {t.name: t.flags for t in describe(agent).tools}
    assert flags["restart"] == {"requires_confirmation": True}
    assert flags["migrate"] == {"external_execution": True} and flags["status"] == {}
    with pytest.raises(ConfigurationError, match="does not have"):
        Toolkit(name="x", tools=[lambda: None], requires_confirmation_tools=["nope"]).tools  # noqa: B018
    with pytest.raises(ConfigurationError, match="on_timeout"):
        tool(requires_confirmation=True, on_timeout="later")(lambda: None)
    with pytest.raises(ConfigurationError, match="user_input_fields"):
        tool(requires_user_input=True, user_input_fields=["nope"])(lambda x: x)


def test_a_decided_requirement_reads_back_as_agno_shapes_it(inline: InMemoryDispatcher) -> None:
    _, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay])
    out = agent.run("pay bob")
    req = out.requirements[0]
    req.reject(note="too much")

    done = agent.continue_run(out, by="ann")

    stored = done.requirements[0]
    assert stored.confirmation is False and stored.confirmation_note == "too much" and stored.is_resolved()
    assert stored.decided_by == "ann" and stored.decided_at is not None
    assert json.loads(json.dumps(stored.decision.to_json() if stored.decision else {})) == {
        "kind": "reject",
        "note": "too much",
    }


def test_the_requirements_of_one_batch_read_back_in_the_order_of_its_calls(inline: InMemoryDispatcher) -> None:
    @tool(requires_confirmation=True)
    def step(n: int) -> str:
        """One step."""
        return f"step {n}"

    script = ScriptConfig(batches=[[{"tool": "step", "arguments": {"n": n}} for n in range(6)]])
    agent = Agent(name=name(), model=CountingModel(script=script), tools=[step])

    out = agent.run("go")

    asked = [r.tool_execution.tool_args for r in out.active_requirements if r.tool_execution is not None]
    assert asked == [{"n": n} for n in range(6)]
    assert [
        r.tool_execution.tool_args for r in agent.client.pending(agent_name=agent.name) if r.tool_execution
    ] == asked


def test_a_rejection_stands_when_a_deploy_dropped_the_tools_flag_before_the_run_resumed(
    inline: InMemoryDispatcher,
) -> None:
    paid, pay = payments()
    agent = Agent(name=name(), model=CountingModel(), tools=[pay])
    inline.autorun = False
    run_id = agent.start("pay bob").run_id
    inline.run_until_idle()
    [req] = agent.client.get_run(run_id).active_requirements

    agent.client.decide(run_id, req.id, Decision(kind="reject", note="no"))
    # The next version dropped the flag: its worker serves another definition than the run's
    pay.requires_confirmation = False  # type: ignore[attr-defined]
    with inline.store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(definition_hash="0" * 64))
    inline.run_until_idle()

    done = agent.client.get_run(run_id)
    assert done.status == S.COMPLETED and paid == []
    assert [m.content for m in done.messages if m.role == "tool"] == ["no"]
