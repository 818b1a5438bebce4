"""Two deciders racing on one requirement, on PostgreSQL: two threads, released together, decide
the same requirement of a PAUSED run differently (one approves, one rejects), round after round.
Exactly one decision is stored every round; the other decider gets DecisionConflictError naming
the one who decided first; the run is queued again once (one "resume") and the call runs only if
the approval won. Which one wins a round is the race's; what the test asserts holds for both.
Two deciders of the last two requirements of a batch, released together: both are stored and
the run is queued again once, whichever came second (it sees the first's decision, though its
statement began before that committed). The steps run inline (the in-memory dispatcher on the
real database)."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

from orchestrator import Agent, Decision, DecisionConflictError, RunStatus, tool
from orchestrator.client import Client
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from tests.integration.test_hitl_deadline_races import ROUNDS, definitions, events_of, inline, paused_run
from tests.support import CountingModel

__all__ = ["inline"]  # the fixture, on PostgreSQL

S = RunStatus
DECIDERS = {"ann": Decision(kind="confirm"), "bob": Decision(kind="reject", note="not today")}


def race(client: Client, run_id: str, plan: dict[str, tuple[str, Decision]]) -> dict[str, Any]:
    """The deciders of `plan` at once, each from a thread of its own (by name: the requirement it
    decides and how); what each got."""
    gate = threading.Barrier(len(plan))
    got: dict[str, Any] = {}

    def decide(by: str) -> None:
        gate.wait()
        try:
            got[by] = client.decide(run_id, *plan[by], by=by)
        except Exception as exc:
            got[by] = exc

    threads = [threading.Thread(target=decide, args=(by,)) for by in plan]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), "a decision never returned"
    return got


def test_two_deciders_racing_on_one_requirement_one_wins_and_the_other_is_told_who(
    inline: InMemoryDispatcher,
) -> None:
    payer, _, paid = definitions()
    won: Counter[str] = Counter()
    for _ in range(ROUNDS):
        run_id, _, requirement_id = paused_run(inline, payer)

        got = race(inline.client, run_id, {by: (requirement_id, d) for by, d in DECIDERS.items()})

        [winner] = [by for by, answer in got.items() if not isinstance(answer, Exception)]
        [loser] = [by for by in DECIDERS if by != winner]
        refused = got[loser]
        assert isinstance(refused, DecisionConflictError), refused
        assert refused.decided_by == winner and f"by {winner}" in str(refused)
        [stored] = inline.store.requirements.of_run(run_id)
        assert stored.decided_by == winner and stored.decision == DECIDERS[winner]
        logged = events_of(inline, run_id)
        assert logged.count(("decision", run_id)) == 1 and logged.count(("resume", run_id)) == 1
        inline.run_until_idle()
        assert inline.store.get_record(run_id).status == S.COMPLETED
        won[winner] += 1
    assert sum(won.values()) == ROUNDS and len(paid) == won["ann"]
    print(f"{dict(won)} of {ROUNDS} rounds")


def test_two_deciders_of_the_last_two_requirements_at_once_queue_the_run_once(inline: InMemoryDispatcher) -> None:
    # Given runs each paused on a batch of two calls that need a confirmation
    paid: list[int] = []

    @tool(requires_confirmation=True)
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return "paid"

    calls = [{"tool": "pay", "arguments": {"amount": n}} for n in (1, 2)]
    model = CountingModel(script=ScriptConfig(batches=[calls], final_text="{tool_results}"))
    payer = Agent(name=f"race-pair-{uuid.uuid4().hex[:6]}", model=model, tools=[pay])
    for _ in range(ROUNDS):
        run_id = inline.client.start(payer.name, input="pay").run_id
        inline.run_until_idle()
        first, second = (r.id for r in inline.client.get_run(run_id).active_requirements)

        # When two deciders confirm one each, at once
        confirm = Decision(kind="confirm")
        got = race(inline.client, run_id, {"ann": (first, confirm), "bob": (second, confirm)})

        # Then both are stored, and the run is queued again exactly once
        assert not any(isinstance(answer, Exception) for answer in got.values()), got
        assert {r.status for r in inline.store.requirements.of_run(run_id)} == {"decided"}
        assert inline.store.get_record(run_id).status == S.QUEUED
        logged = events_of(inline, run_id)
        assert logged.count(("decision", run_id)) == 2 and logged.count(("resume", run_id)) == 1
        assert logged[-1] == ("resume", run_id)
        inline.run_until_idle()
        assert inline.store.get_record(run_id).status == S.COMPLETED
    assert sorted(paid) == [1] * ROUNDS + [2] * ROUNDS
