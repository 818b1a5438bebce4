"""A decision stored at once (`store/deciding.py`: on PostgreSQL one statement) writes exactly the
rows the general path writes, on both databases: the requirement as decided, its "decision" event,
and for the last one of a batch the run queued again with its "resume" event, the same text and
order; and it is left to the general path while another definition of its agent is live than the
one that paused the call, where a deploy that changed the paused tool refuses it; neither path
stores a decision that comes after the run's own deadline. Steps run inline (the in-memory
dispatcher on the real database)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator import Agent, Decision, DecisionExpiredError, PausedToolChangedError, RunStatus, Tool, tool
from orchestrator.catalog import write_served
from orchestrator.paused_tools import CatalogDoor
from orchestrator.settings import Settings
from orchestrator.store import deciding
from orchestrator.store.catalog_rows import CatalogRow
from orchestrator.store.requirement_rows import PausedCall
from orchestrator.store.tables import events, requirements, runs
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import ScriptConfig
from tests.support import CountingModel

S = RunStatus


@pytest.fixture
def inline(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url, autorun=False) as dispatcher:
        yield dispatcher


def payer() -> Agent:
    @tool(requires_confirmation=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    calls = [{"tool": "pay", "arguments": {"amount": n}} for n in (1, 2)]
    model = CountingModel(script=ScriptConfig(batches=[calls], final_text="{tool_results}"))
    return Agent(name=f"at-once-{uuid.uuid4().hex[:6]}", model=model, tools=[pay])


def decided_run(inline: InMemoryDispatcher, agent: Agent) -> tuple[str, list[Any]]:
    """A run paused on two calls, both decided (a reject with a note, then a confirm); the run's
    id and what each decision returned."""
    run_id = inline.client.start(agent.name, input="pay").run_id
    inline.run_until_idle()
    first, second = inline.client.get_run(run_id).active_requirements
    decisions = [Decision(kind="reject", note="not that one"), Decision(kind="confirm")]
    store = inline.store.requirements
    grace = inline.settings.publish_grace_seconds
    return run_id, [
        store.decide(run_id, r.id, d, by="ann", publish_grace=grace)
        for r, d in zip((first, second), decisions, strict=True)
    ]


def written(inline: InMemoryDispatcher, run_id: str) -> dict[str, Any]:
    """What the decisions left in the database, with ids and times made comparable."""
    with inline.store.engine.connect() as conn:
        run = conn.execute(select(runs).where(runs.c.run_id == run_id)).one()
        rows = conn.execute(
            select(requirements).where(requirements.c.run_id == run_id).order_by(requirements.c.created_at)
        ).all()
        logged = conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.id)).all()
    names = {row.id: f"req{i}" for i, row in enumerate(rows)} | {run_id: "run"}
    at, grace = rows[-1].decided_at, inline.settings.publish_grace_seconds  # the outbox marker: at + grace

    def plain(text: str | None) -> str | None:
        for real, name in names.items():
            text = text.replace(real, name) if text else text
        return text

    return {
        "run": (
            run.status,
            run.epoch,
            run.seq,
            run.n_messages,
            0 <= run.publish_after - at - grace < 5,
            run.lease_owner,
        ),
        "requirements": [
            (r.status, r.decision, r.decided_by, r.decided_at is not None and r.decided_at <= at) for r in rows
        ],
        "events": [(e.kind, e.seq, plain(e.detail)) for e in logged if e.kind in ("decision", "resume")],
    }


def test_a_decision_stored_at_once_writes_what_the_general_path_writes(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = payer()
    # Given two runs paused alike; one decided at once, the other on the general path
    at_once, answers = decided_run(inline, agent)
    monkeypatch.setattr(deciding, "answered_by", lambda decision: None)  # no decision is the common case
    general, expected = decided_run(inline, agent)

    # Then the rows are the same, and so is what each decision returned
    assert written(inline, at_once) == written(inline, general)
    assert [(a.requirement.status, a.already, a.resumed is None) for a in answers] == [
        (e.requirement.status, e.already, e.resumed is None) for e in expected
    ]
    resumed = answers[-1].resumed
    assert resumed is not None and resumed == inline.store.get_record(at_once)
    assert resumed.status == S.QUEUED and answers[0].requirement.decision == Decision(
        kind="reject", note="not that one"
    )
    # The event texts are Store.log_event's, exactly
    [decision, *_] = written(inline, at_once)["events"]
    assert json.loads(decision[2])["decision"] == "reject ('not that one')"
    inline.client.control.publish(resumed)  # as Client.decide does
    inline.run_until_idle()
    assert inline.store.get_record(at_once).status == S.COMPLETED


def version(agent_name: str, *tools: Tool, instructions: str | None = None) -> Agent:
    """A version of the agent `agent_name` (each defined on this line replaces the one before)."""
    return Agent(name=agent_name, model=CountingModel(), tools=list(tools), instructions=instructions)


class Watched:
    """The producer's door (`CatalogDoor`), counting the decisions it is asked about: only the
    general path asks it."""

    def __init__(self, settings: Settings) -> None:
        self.door = CatalogDoor(settings)
        self.window = self.door.window
        self.asked = 0

    def __call__(self, paused: PausedCall, served: CatalogRow | None) -> None:
        self.asked += 1
        self.door(paused, served)


def test_a_decision_is_stored_at_once_only_while_no_other_definition_of_its_agent_is_live(
    inline: InMemoryDispatcher,
) -> None:
    @tool(requires_confirmation=True)
    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    def lookup(query: str) -> str:
        """Look something up."""
        return query

    agent_name = f"at-once-{uuid.uuid4().hex[:6]}"
    version(agent_name, pay)
    runs_ = [inline.client.start(agent_name, input="pay").run_id for _ in range(3)]
    inline.run_until_idle()  # the worker wrote its definition into the catalog, and each run paused
    (a, ra), (b, rb), (c, rc) = ((r, inline.client.get_run(r).active_requirements[0].id) for r in runs_)
    door, grace, store = Watched(inline.settings), inline.settings.publish_grace_seconds, inline.store.requirements

    # While the definition that paused the runs is the only live one: at once, the door not asked
    store.decide(a, ra, Decision(kind="confirm"), by="ann", publish_grace=grace, door=door)
    assert door.asked == 0
    # A worker of another version is live, with `pay` as it was: the general path checks and stores
    write_served(inline.store, [version(agent_name, pay, instructions="Be brief.")])
    store.decide(b, rb, Decision(kind="confirm"), by="ann", publish_grace=grace, door=door)
    assert door.asked == 1 and inline.store.get_record(b).status == S.QUEUED
    # One without `pay`: refused, nothing written
    write_served(inline.store, [version(agent_name, lookup)])
    with pytest.raises(PausedToolChangedError, match="tool 'pay' is gone"):
        store.decide(c, rc, Decision(kind="confirm"), by="ann", publish_grace=grace, door=door)
    assert door.asked == 2 and inline.store.get_record(c).status == S.PAUSED
    assert [r.status for r in inline.client.get_run(c).requirements] == ["pending"]
    assert "decision" not in [e["kind"] for e in inline.store.get_events(c)]
    # A rejection is checked against nothing: stored at once
    store.decide(c, rc, Decision(kind="reject"), by="ann", publish_grace=grace, door=door)
    assert door.asked == 2 and inline.store.get_record(c).status == S.QUEUED


def test_a_decision_after_the_runs_deadline_is_refused_and_writes_nothing_before_the_sweep_stops_the_run(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = payer()
    run_id = inline.client.start(agent.name, input="pay", run_timeout=60).run_id
    inline.run_until_idle()
    first, second = inline.client.get_run(run_id).active_requirements
    deadline = inline.store.get_record(run_id).deadline_at
    assert deadline is not None
    grace = inline.settings.publish_grace_seconds
    inline.store.requirements.decide(run_id, first.id, Decision(kind="confirm"), by="ann", publish_grace=grace)
    monkeypatch.setattr(inline.store, "clock", lambda: deadline + 1)  # before any sweep came

    # The last pending one, which would resume the run: refused on the fast path and the general one
    with pytest.raises(DecisionExpiredError, match=f"run {run_id} passed its deadline"):
        inline.store.requirements.decide(run_id, second.id, Decision(kind="confirm"), by="ann", publish_grace=grace)

    with inline.store.engine.connect() as conn:
        statuses = (
            conn.execute(
                select(requirements.c.status).where(requirements.c.run_id == run_id).order_by(requirements.c.created_at)
            )
            .scalars()
            .all()
        )
        kinds = conn.execute(select(events.c.kind).where(events.c.run_id == run_id)).scalars().all()
    assert sorted(statuses) == ["decided", "pending"] and kinds.count("decision") == 1 and "resume" not in kinds
    assert inline.store.get_record(run_id).status == S.PAUSED
    assert inline.sweep().stopped == [run_id]
    stopped = inline.client.get_run(run_id)
    assert stopped.status == S.ERROR and stopped.error is not None and stopped.error.type == "RunTimeoutError"
