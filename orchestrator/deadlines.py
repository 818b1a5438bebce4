"""Deadlines that fire: what a pause's deadline does when nobody decided in time, and what a
run's own deadline does when the run is still going (the end of this docstring).

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

A run's deadline (`run_timeout=`: on a start, else its agent's; `RunRecord.deadline_at`) is
wall-clock time from the start, PAUSED time included: it is a promise to whoever started the run
that it has stopped by then, whether it waits for a worker, a model, a tool or a person (a pause's
own `pause_timeout` bounds one wait only). Each sweeper pass reads the runs still going past
theirs (`Endings.past_deadline`) first, and `stop` ends each one's tree: the run, and every run
under it that has not ended, in ERROR with RunTimeoutError (`Endings.time_out`), in one
transaction. ERROR, not CANCELLED, so that the run can be read as it stopped and continued: a
continue gives it its `run_timeout` again from then (or the continue's own:
`orchestrator.continuing`). A step in progress is fenced as a cancel fences it (its epoch
bumped): nothing it writes after the deadline is kept (a model reply, a tool's result, the
batch's commit), while what it committed before stays; a tool whose result was dropped runs again
when the run is continued (one `at_most_once` does not: the continue stops with
ToolInterruptedError, as after a worker died). No step is claimed past a run's deadline, so a
run parked QUEUED never starts one late.

When: at the first sweep after the deadline, within one RATCHET_SWEEP_SECONDS of it, as above. A
run whose step commits its final answer between the deadline and that sweep is COMPLETED; a
decision that comes then is refused with DecisionExpiredError (`Requirements.decide`), so a
PAUSED run never resumes past its deadline.

This module decides and writes through the store only; what to publish and which ended runs to
follow up (`Fired`, the runs `stop` ended) goes back to the sweeper.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from orchestrator.errors import (
    DecisionConflictError,
    DecisionExpiredError,
    PauseTimeoutError,
    RunNotPausedError,
    RunTimeoutError,
)
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


def stop(store: Store, record: RunRecord) -> list[RunRecord]:
    """Stop the run `record` (one `Endings.past_deadline` returned) and its tree, its deadline
    having passed: the runs moved to ERROR, the run first; [] if it is not the deadline's to act
    on any more (the run ended, or a continue gave it a new deadline, or another sweeper acted)."""
    return store.endings.time_out(record.run_id, lambda run, top: run_timeout_error(run, top).to_record())


def run_timeout_error(run: RunRecord, top: RunRecord) -> RunTimeoutError:
    """The error a run's deadline stops `run` with: its own (`top` is `run`), or its team's."""
    given = "" if top.run_timeout is None else f" ({top.run_timeout:g}s of run_timeout, PAUSED time included)"
    when = f"its deadline at {_when(top.deadline_at)}{given}"
    if run.run_id != top.run_id:
        return RunTimeoutError(
            f"run {run.run_id} was stopped with its team's run {top.run_id}, which passed {when} before it finished. "
            f"Continue the team run ({top.run_id}): it continues this member in place, then the leader"
        )
    return RunTimeoutError(
        f"run {run.run_id} passed {when} before it finished, so it was stopped; every message it committed is "
        "kept. Continue it to go on: it gets its run_timeout again from the continue, or pass a new one "
        "(continue_run(run_id, run_timeout=...), `ratchet continue RUN_ID --run-timeout 30m`)"
    )


def _when(at: float | None) -> str:
    if at is None:
        return "?"
    return datetime.datetime.fromtimestamp(at, datetime.UTC).isoformat(timespec="seconds")


__all__ = ["Fired", "fire", "run_timeout_error", "stop", "timeout_error"]
