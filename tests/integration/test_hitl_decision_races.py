"""Two deciders racing on one requirement, on PostgreSQL: two threads, released together, decide
the same requirement of a PAUSED run differently (one approves, one rejects), round after round.
Exactly one decision is stored every round; the other decider gets DecisionConflictError naming
the one who decided first; the run is queued again once (one "resume") and the call runs only if
the approval won. Which one wins a round is the race's; what the test asserts holds for both. The
steps run inline (the in-memory dispatcher on the real database)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from orchestrator import Decision, DecisionConflictError, RunStatus
from orchestrator.client import Client
from orchestrator.testing import InMemoryDispatcher
from tests.integration.test_hitl_deadline_races import ROUNDS, definitions, events_of, inline, paused_run

__all__ = ["inline"]  # the fixture, on PostgreSQL

S = RunStatus
DECIDERS = {"ann": Decision(kind="confirm"), "bob": Decision(kind="reject", note="not today")}


def race(client: Client, run_id: str, requirement_id: str) -> dict[str, Any]:
    """Both deciders at once, from two threads; what each got."""
    gate = threading.Barrier(len(DECIDERS))
    got: dict[str, Any] = {}

    def decide(by: str) -> None:
        gate.wait()
        try:
            got[by] = client.decide(run_id, requirement_id, DECIDERS[by], by=by)
        except Exception as exc:
            got[by] = exc

    threads = [threading.Thread(target=decide, args=(by,)) for by in DECIDERS]
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

        got = race(inline.client, run_id, requirement_id)

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
