"""Run states, the one table of legal moves between them, and the one function that applies it.

A run is written QUEUED; every later write of its status takes its value from `transition`, which
refuses a move the table lacks. The store applies the move as a guarded `UPDATE ... WHERE status
IN (...) AND epoch = ...` (`store.writes.move`, and the prebuilt claim and commit in
`store/statements.py`), so a duplicate delivery, a double-clicked continue or a stale worker
changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class RunStatus(StrEnum):
    """The status of a run."""

    #: Written; a step is enqueued (or due and waiting for the sweeper to publish it).
    QUEUED = "QUEUED"
    #: A worker holds the lease for the current step.
    RUNNING = "RUNNING"
    #: A team run waiting for its member runs; holds no worker.
    WAITING = "WAITING"
    #: Waiting for a person (a confirmation, input, an external result) or a raised budget; holds
    #: no worker, lease or task (`orchestrator.requirements`). A team is PAUSED while a member is.
    PAUSED = "PAUSED"
    #: A step failed for good; the row keeps every message and the error. Continue resumes in place.
    ERROR = "ERROR"
    #: The final answer is committed. Continue forks a new run from it.
    COMPLETED = "COMPLETED"
    #: Cancelled by a user. Final: continue is refused.
    CANCELLED = "CANCELLED"

    @property
    def is_final(self) -> bool:
        """True where the run will not move again by itself (wait() returns on these)."""
        return self in FINAL


#: Where `wait()` stops: the run needs nobody's work until someone acts on it.
FINAL = frozenset({RunStatus.COMPLETED, RunStatus.ERROR, RunStatus.CANCELLED, RunStatus.PAUSED})

S = RunStatus

#: from-status -> the statuses it may move to. Every write of a status is checked against this.
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    # claim; a team delegating; a poison or unrecoverable step found before it starts; cancel
    S.QUEUED: frozenset({S.RUNNING, S.ERROR, S.CANCELLED}),
    # commit (next step queued), final answer, failure, team waits on members, re-claim after an
    # expired lease (RUNNING -> RUNNING with a new epoch), a tool batch pauses for a person, cancel
    S.RUNNING: frozenset({S.QUEUED, S.COMPLETED, S.ERROR, S.WAITING, S.RUNNING, S.PAUSED, S.CANCELLED}),
    # the last member finished (leader's next step queued), a member failed, a member paused, cancel
    S.WAITING: frozenset({S.QUEUED, S.ERROR, S.PAUSED, S.CANCELLED}),
    # the last requirement decided (the run queued again; a team back to waiting on its members),
    # a deadline's policy ("error"), cancel
    S.PAUSED: frozenset({S.QUEUED, S.WAITING, S.ERROR, S.CANCELLED}),
    # continue in place (or back to WAITING when a team's failed member is continued); cancel
    S.ERROR: frozenset({S.QUEUED, S.WAITING, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.CANCELLED: frozenset(),
}


def can_move(src: RunStatus, dst: RunStatus) -> bool:
    """Whether `src -> dst` is a legal move."""
    return dst in TRANSITIONS[src]


def transition(src: Iterable[RunStatus], dst: RunStatus) -> str:
    """The status value a write stores for a move from any of `src` to `dst`.

    ValueError if the table lacks one of those moves: a bug in Ratchet, never in its input. A
    plain check, not an `assert`, so `python -O` keeps it."""
    for s in src:
        if not can_move(s, dst):
            raise ValueError(f"illegal run transition {s} -> {dst}")
    return dst.value
