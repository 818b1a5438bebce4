"""Deadlines that fire: what a pause's deadline does when nobody decided in time.

A paused call's requirement carries `deadline_at` (when it paused, plus the `pause_timeout=` of
its tool, else of its agent) and `on_timeout`. Each sweeper pass (`Sweeper.sweep_once`) reads the
requirements whose deadline passed, of runs still PAUSED (`Requirements.due`), and `fire` applies
the policy of each:

- "reject" (the default): the call is rejected, by "deadline"; the model reads that nobody
  decided before the deadline and that the call was not run. "approve": a confirmation is
  confirmed and the call runs (a requirement of another kind is rejected: there is no input or
  result to make up). Both are decisions stored through the path a person's takes
  (`Requirements.decide(at_deadline=True)`), so the last one of its run queues the run again.
- "cancel": the whole tree of the run, from its top run (the one a user started: a member's
  deadline cancels its team, as cancelling the team would), CANCELLED, what it asked void.
- "error": the run PAUSED -> ERROR with PauseTimeoutError, which names the call and the
  deadline; its requirements expired. A member's team then fails as for any failed member.
  Continuing the run pauses the call again with a new requirement and a new deadline.

A requirement whose policy asks a decision that cannot answer it (a budget's: only a raised
budget does) ends its run as "error" does.

When: at the first sweep after the deadline, so within one RATCHET_SWEEP_SECONDS (5 s by default)
of it while a worker sweeps (or `ratchet beat` sends the sweep); a deadline shorter than that
interval fires up to one interval late. When the worker holding the sweep lease dies, another
takes over within `sweeping.LEASE_SWEEPS` + 1 intervals. Nobody has to continue the run for it.

Once: each write checks again, under the lock of the run tree's root row, that the requirement
is pending, its run PAUSED and its deadline passed, and otherwise changes nothing. Two sweepers,
or a sweeper and a person's decision, take turns; the second finds nothing left to do. A
person's decision that comes after the deadline is refused with DecisionExpiredError, whether
the deadline acted yet or not: the check reads `deadline_at` from the row, so a restart in
between changes nothing.

Why: the transaction that acts logs "deadline" on the requirement's run (the requirement, the
policy, the deadline), beside the decision ("decision", by "deadline"), the cancel or the error.

This module decides and writes through the store only; what to publish and which ended runs to
follow up (`Fired`) goes back to the sweeper.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from orchestrator.errors import DecisionConflictError, DecisionExpiredError, PauseTimeoutError, RunNotPausedError
from orchestrator.requirements import DEADLINE, OnTimeout, RunRequirement, timeout_decision
from orchestrator.run import RunRecord
from orchestrator.store import Store


@dataclass(frozen=True, kw_only=True)
class Fired:
    """What one deadline did: its requirement and policy, the run it queued again (its step to
    publish), the teams it moved back to WAITING, and the runs it ended (ERROR, CANCELLED), each
    to follow up as any run that ends (its place among its key's runs, its team's fan-in)."""

    requirement: RunRequirement
    policy: OnTimeout
    resumed: RunRecord | None = None
    teams: tuple[RunRecord, ...] = ()
    ended: tuple[RunRecord, ...] = ()


def fire(store: Store, requirement: RunRequirement, *, publish_grace: float) -> Fired | None:
    """Apply the deadline of `requirement` (one `Requirements.due` returned); None if it is not
    the deadline's to act on any more (a person decided in time, the run was cancelled or moved
    on, another sweeper acted)."""
    policy: OnTimeout = requirement.on_timeout or "reject"
    if policy == "cancel":
        cancelled = store.endings.cancel_tree(requirement.id)
        return Fired(requirement=requirement, policy=policy, ended=tuple(cancelled)) if cancelled else None
    decision = timeout_decision(requirement)
    if decision is None:  # "error", or a budget no decision of the deadline's can raise
        failed = store.endings.expire(requirement.id, error=timeout_error(requirement).to_record())
        return Fired(requirement=requirement, policy=policy, ended=(failed,)) if failed is not None else None
    try:
        done = store.requirements.decide(
            requirement.run_id, requirement.id, decision, by=DEADLINE, publish_grace=publish_grace, at_deadline=True
        )
    except (DecisionConflictError, DecisionExpiredError, RunNotPausedError):
        return None  # decided in time by a person, ended by another policy, or the run moved on
    if done.already:
        return None
    return Fired(requirement=done.requirement, policy=policy, resumed=done.resumed, teams=done.teams)


def timeout_error(requirement: RunRequirement) -> PauseTimeoutError:
    """The error a deadline's "error" ends the run with: which call, asked what, and when."""
    call, run_id, when = requirement.tool_execution, requirement.run_id, _when(requirement.deadline_at)
    if call is None:
        what = f"nobody raised the budget of run {run_id} (requirement {requirement.id})"
    else:
        asked = requirement.pause_type.replace("_", " ")
        what = (
            f"nobody decided call {call.tool_name} ({call.tool_call_id}) of run {run_id} "
            f"({asked}, requirement {requirement.id})"
        )
    return PauseTimeoutError(
        f"{what} before its deadline at {when} (on_timeout {requirement.on_timeout or 'error'!r}). "
        "Continue the run to pause it again with a new deadline, or give it a longer pause_timeout"
    )


def _when(at: float | None) -> str:
    if at is None:
        return "?"
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="seconds")


__all__ = ["Fired", "fire", "timeout_error"]
