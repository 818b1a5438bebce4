"""Runs ended by someone other than their own step, with what they asked of a person
(`Store.endings`): a cancel, a pause's deadline whose policy ends the run, and a run's deadline.

- `cancel(run_id)`: one run CANCELLED (from any status but COMPLETED and CANCELLED) and its
  pending requirements void, in one transaction. A PAUSED member is cancelled under its tree's
  root lock, as a decision is stored (`store/paused.py`), and each team its pause held PAUSED
  whose tree has nothing else pending goes back to WAITING, so the fan-in hands the team a tool
  error for it (`RunControl.cancel` fans in).
- `expire(requirement_id, error)`: on_timeout "error". The requirement's run PAUSED -> ERROR with
  `error`, every pending requirement of it expired, and each team above it PAUSED -> WAITING, so
  the fan-in that follows (`delegation.after_member_final`) fails them as a failed member does.
- `cancel_tree(requirement_id)`: on_timeout "cancel". The top run of the requirement's tree and
  every run under it that has not ended, CANCELLED in one transaction, their pending
  requirements void.

Both deadline writes first check, under the root's lock, that the requirement is pending, its
run PAUSED and its deadline passed, and otherwise change nothing (None): a person decided in
time, a cancel came first, or another sweeper acted. So a deadline acts once. Each logs
"deadline" on the requirement's run (`paused.log_deadline`: the requirement, its policy, when).

- `past_deadline(now)`: the runs going past their own deadline (`deadline_at`), for the sweeper.
- `time_out(run_id, errors)`: the run, and every run under it that has not ended (QUEUED,
  RUNNING, WAITING, PAUSED), moved to ERROR with the error `errors` gives each, in one
  transaction under the root's lock, after checking there that the run is still going and its
  deadline passed (a continue that gave a new one, a run that ended, another sweeper: nothing).
  Each move bumps the epoch and clears the lease, as a cancel does, so a step in progress is
  fenced: its next write (a tool's result, the step's commit) matches nothing and is dropped.
  Pending requirements expire; each run logs "error" (RunError, and the metrics' count).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, select, update

from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import reads, writes
from orchestrator.store.paused import log_deadline, row_of
from orchestrator.store.requirement_rows import from_row
from orchestrator.store.tables import requirements, runs
from orchestrator.store.trees import ancestors, lock, lock_root, lock_run, wake_teams

if TYPE_CHECKING:
    from orchestrator.store.backend import Backend
    from orchestrator.store.store import Store

S = RunStatus
#: Where a cancel applies (COMPLETED and CANCELLED are final).
CANCELLABLE = (S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED, S.ERROR)
#: Where a run's deadline stops it: every status of a run that is going or waits for a person.
GOING = (S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED)
#: The error a run stopped by its tree's deadline ends with, given it and the tree's top run.
Errors = Callable[[RunRecord, RunRecord], dict[str, str]]


class Endings:
    """Cancels and the deadlines that end a run, on the store's guarded moves."""

    def __init__(self, store: Store, backend: Backend) -> None:
        self._store = store
        self._backend = backend

    # ---------------------------------------------------------------- cancel

    def cancel(self, record: RunRecord) -> RunRecord | None:
        """Cancel one run, as read in `record` (not its members: the caller walks them), and void
        its pending requirements; the row as cancelled, or None if it ended meanwhile (COMPLETED,
        CANCELLED) or is gone. A run that is not a PAUSED member is one guarded move; a PAUSED
        member is cancelled under its root's lock and wakes the teams its pause held (see above)."""
        store, run_id = self._store, record.run_id
        member = record.parent_run_id is not None
        if not (member and record.status == S.PAUSED):
            with store.engine.begin() as conn:
                # A member that paused since it was read is left to the branch below.
                src = tuple(s for s in CANCELLABLE if s != S.PAUSED) if member else CANCELLABLE
                moved = _cancel(conn, store, run_id, src)
            if moved is not None or not member:
                return moved
        with store.engine.begin() as conn:
            chain = ancestors(conn, record)
            root = chain[-1].run_id if chain else run_id
            lock(conn, root)
            current = lock_run(conn, run_id)
            moved = _cancel(conn, store, run_id, CANCELLABLE)
            if moved is not None and current is not None and current.status == S.PAUSED:
                wake_teams(conn, store, moved, root)
            return moved

    # ---------------------------------------------------------------- deadlines

    def expire(self, requirement_id: str, *, error: dict[str, str]) -> RunRecord | None:
        """on_timeout "error": the requirement's run PAUSED -> ERROR with `error`, its pending
        requirements expired, the teams above it WAITING for the fan-in that fails them. The
        run's ERROR row, or None if the deadline is not the requirement's to act on any more."""
        store = self._store
        with store.engine.begin() as conn:
            due = self._due(conn, requirement_id)
            if due is None:
                return None
            _, run = due
            conn.execute(
                update(requirements)
                .where(requirements.c.run_id == run.run_id, requirements.c.status == "pending")
                .values(status="expired")
            )
            values = writes.error_values(error, None)
            failed = store.move(run.run_id, src=(S.PAUSED,), dst=S.ERROR, epoch=run.epoch, conn=conn, **values)
            assert failed is not None, "the run is PAUSED under its root's lock"
            where = writes.position(failed)
            store.log_event(
                conn,
                run.run_id,
                "error",
                failed.seq,
                type=values["error_type"],
                message=values["error_message"],
                **where,
            )
            for team in ancestors(conn, failed):
                store.move(team.run_id, src=(S.PAUSED,), dst=S.WAITING, conn=conn)
            return failed

    def cancel_tree(self, requirement_id: str) -> list[RunRecord]:
        """on_timeout "cancel": the top run of the requirement's tree and every run under it that
        has not ended, CANCELLED, their pending requirements void, in one transaction. The rows
        cancelled, the top run first; none if the deadline is not the requirement's to act on."""
        store = self._store
        with store.engine.begin() as conn:
            due = self._due(conn, requirement_id)
            if due is None:
                return []
            top, _ = due
            cancelled: list[RunRecord] = []
            todo = [top]
            while todo:
                run_id = todo.pop(0)
                moved = _cancel(conn, store, run_id, CANCELLABLE)
                if moved is not None:
                    cancelled.append(moved)
                todo += [child.run_id for child in reads.children(conn, run_id) if child.status in CANCELLABLE]
            return cancelled

    # ---------------------------------------------------------------- a run's deadline

    def past_deadline(self, now: float, *, limit: int = 100) -> list[RunRecord]:
        """The runs still going (or PAUSED) whose own deadline passed by `now`, the oldest first."""
        query = (
            select(runs)
            .where(runs.c.status.in_([s.value for s in GOING]), runs.c.deadline_at <= now)
            .order_by(runs.c.deadline_at)
            .limit(limit)
        )
        return self._backend.quick(lambda c: [RunRecord.from_row(row) for row in c.execute(query)])

    def time_out(self, run_id: str, errors: Errors) -> list[RunRecord]:
        """Stop the run whose deadline passed, and its tree (see above): the rows moved to ERROR,
        the run first; [] if its deadline is not the sweeper's to act on any more."""
        store = self._store
        with store.engine.begin() as conn:
            lock_root(conn, run_id)
            top = lock_run(conn, run_id)
            if top is None or top.status not in GOING or top.deadline_at is None or store.clock() < top.deadline_at:
                return []
            stopped: list[RunRecord] = []
            todo = [top]
            while todo:
                run = todo.pop(0)
                moved = _stop(conn, store, run, errors(run, top))
                if moved is not None:
                    stopped.append(moved)
                todo += [child for child in reads.children(conn, run.run_id) if child.status in GOING]
            return stopped

    def _due(self, conn: Connection, requirement_id: str) -> tuple[str, RunRecord] | None:
        """Under the root's lock: the id of the requirement's root run and its run, if its deadline
        is due to act (pending, past its deadline, its run PAUSED), with "deadline" logged; else None."""
        row = row_of(conn, requirement_id)
        if row is None or not lock(conn, row.root_run_id):
            return None
        row = row_of(conn, requirement_id)
        run = lock_run(conn, row.run_id) if row is not None else None
        if row is None or run is None:
            return None
        requirement = from_row(row)
        deadline = requirement.deadline_at
        if requirement.status != "pending" or run.status != S.PAUSED or deadline is None:
            return None
        if self._store.clock() < deadline:
            return None
        log_deadline(self._store, conn, run, requirement)
        return row.root_run_id, run


def _stop(conn: Connection, store: Store, run: RunRecord, error: dict[str, str]) -> RunRecord | None:
    """The run ERROR with `error` from any status in GOING, its step fenced (epoch bumped, lease
    cleared) and its pending requirements expired, logged "error", in the caller's transaction;
    None if it had ended."""
    values = writes.error_values(error, None)
    moved = store.move(run.run_id, src=GOING, dst=S.ERROR, bump_epoch=True, conn=conn, **values)
    if moved is None:
        return None
    conn.execute(
        update(requirements)
        .where(requirements.c.run_id == run.run_id, requirements.c.status == "pending")
        .values(status="expired")
    )
    where = writes.position(moved)
    store.log_event(
        conn, run.run_id, "error", moved.seq, type=values["error_type"], message=values["error_message"], **where
    )
    return moved


def _cancel(conn: Connection, store: Store, run_id: str, src: Sequence[RunStatus]) -> RunRecord | None:
    """The run CANCELLED from `src`, its step fenced (epoch bumped, lease cleared) and its pending
    requirements void, in the caller's transaction; None if it was in none of `src`."""
    values: dict[str, Any] = dict(lease_owner=None, lease_expires_at=None, next_step=None)
    moved = store.move(run_id, src=src, dst=S.CANCELLED, bump_epoch=True, event="cancel", conn=conn, **values)
    if moved is not None:
        conn.execute(
            update(requirements)
            .where(requirements.c.run_id == run_id, requirements.c.status == "pending")
            .values(status="void")
        )
    return moved
