"""A decision that races a cancel, on PostgreSQL: two threads, released together, decide a PAUSED
run's requirement and cancel the run, round after round. Exactly one wins the PAUSED run, every
round: either the decision is stored and queues the run (which the cancel then cancels: its
"resume" is logged before the "cancel"), or the run is CANCELLED first and the decision is refused
with RunNotPausedError, nothing stored (the requirement void). Which one wins a round is the
race's; what the test asserts holds for both, and for a member's requirement while its team is
cancelled from the top. The steps run inline (the in-memory dispatcher on the real database)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from orchestrator import Agent, Decision, RunNotPausedError, RunStatus, Team, tool
from orchestrator.client import Client
from orchestrator.store.tables import events
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import ScriptConfig
from tests.support import CountingModel

S = RunStatus
ROUNDS = 25


@pytest.fixture
def inline(pg_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(pg_url, autorun=False) as dispatcher:
        yield dispatcher


def definitions() -> tuple[Agent, Team, list[int]]:
    paid: list[int] = []

    @tool(requires_confirmation=True)
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return "paid"

    t = uuid.uuid4().hex[:6]
    payer = Agent(name=f"race-payer-{t}", model=CountingModel(), tools=[pay], role="Pays.")
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(payer), "task": "pay"}}
    leader = CountingModel(script=ScriptConfig(batches=[[call]], final_text="{tool_results}"))
    return payer, Team(name=f"race-team-{t}", model=leader, members=[payer]), paid


def race(client: Client, run_id: str, requirement_id: str) -> dict[str, Any]:
    """Decide and cancel at once, from two threads; what each got."""
    gate = threading.Barrier(2)
    got: dict[str, Any] = {}

    def decide() -> None:
        gate.wait()
        try:
            got["decision"] = client.decide(run_id, requirement_id, Decision(kind="confirm"), by="ann")
        except Exception as exc:
            got["decision"] = exc

    def cancel() -> None:
        gate.wait()
        try:
            got["cancel"] = client.cancel(run_id)
        except Exception as exc:
            got["cancel"] = exc

    threads = [threading.Thread(target=decide), threading.Thread(target=cancel)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), "a decision or a cancel never returned"
    return got


def check_one_won(inline: InMemoryDispatcher, got: dict[str, Any], top: str, paused: str, requirement_id: str) -> str:
    """The invariant of a round, whoever won it; which one did."""
    store = inline.store
    assert not isinstance(got["cancel"], Exception), got["cancel"]
    assert got["cancel"].status == S.CANCELLED and store.get_record(top).status == S.CANCELLED
    assert store.get_record(paused).status == S.CANCELLED
    [stored] = [r for r in store.requirements.of_run(paused) if r.id == requirement_id]
    logged = events_of(inline, top, paused)
    if isinstance(got["decision"], RunNotPausedError):
        assert stored.status == "void" and stored.decision is None
        assert ("decision", paused) not in logged and ("resume", paused) not in logged
        return "cancel"
    assert not isinstance(got["decision"], Exception), got["decision"]
    assert got["decision"].status == "decided" and stored.status == "decided" and stored.decided_by == "ann"
    # The decision took the PAUSED run before the cancel reached the top run (ids are given under
    # the root's row lock, in the order its holders took it).
    assert logged.index(("decision", paused)) < logged.index(("resume", paused)) < logged.index(("cancel", top))
    return "decision"


def events_of(inline: InMemoryDispatcher, *run_ids: str) -> list[tuple[str, str]]:
    """The (kind, run_id) of the runs' events, in the order they were logged."""
    query = select(events.c.kind, events.c.run_id).where(events.c.run_id.in_(run_ids)).order_by(events.c.id)
    with inline.store.engine.connect() as conn:
        return [(kind, run_id) for kind, run_id in conn.execute(query)]


def paused_run(inline: InMemoryDispatcher, agent: Agent | Team) -> tuple[str, str, str]:
    """A run of `agent` stepped until it pauses: its id, the paused run's, the requirement's."""
    run_id = inline.client.start(agent.name, input="pay").run_id
    inline.run_until_idle()
    out = inline.client.get_run(run_id)
    assert out.status == S.PAUSED
    [req] = out.active_requirements
    return run_id, req.member_run_id or run_id, req.id


@pytest.mark.parametrize("where", ["run", "member"])
def test_a_decision_racing_a_cancel_either_resumes_the_run_or_is_refused_never_both(
    inline: InMemoryDispatcher, where: str
) -> None:
    payer, team, paid = definitions()
    won: Counter[str] = Counter()
    for _ in range(ROUNDS):
        top, paused, requirement_id = paused_run(inline, payer if where == "run" else team)
        got = race(inline.client, top, requirement_id)
        won[check_one_won(inline, got, top, paused, requirement_id)] += 1
        inline.run_until_idle()  # a step the decision published finds its run cancelled
        assert inline.store.get_record(paused).status == S.CANCELLED
    assert paid == [] and sum(won.values()) == ROUNDS
    print(f"{where}: {dict(won)} of {ROUNDS} rounds")
