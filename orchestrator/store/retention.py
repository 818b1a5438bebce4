"""Deleting stored runs: a whole session (`delete_session`), or the runs that stopped before a
time (`prune`).

A run goes with everything stored for it: its messages, its at-most-once tool starts, its log
(`ratchet_events`), its live events in `ratchet_deltas` and its webhook deliveries (sent or not); a
team run goes with its member runs, recursively. Redis streams are not the store's: it reports
which deleted runs were streamed, and `Client` drops their streams through the delta sink.

A prune leaves the sessions' rows (id, user, state), so a conversation can go on after its old
runs went, and a run started meanwhile in an old session never meets a session half deleted.

Nothing live is deleted: a run QUEUED, RUNNING, WAITING or PAUSED (going, or waiting on a human's
decision) is kept, and so is every run of a team tree with a live run in it; a member of a team
goes with its team, never alone. `delete_session` refuses (RunLiveError naming the run) where
`prune` passes over.

Deletes run in batches, each its own short transaction (at most `batch` runs and, past the first
run, about MESSAGE_BUDGET messages): on SQLite the write lock is held for one batch at a time, on
PostgreSQL only the batch's rows are locked, so workers and producers carry on between batches.
A batch reads its runs again under lock before deleting them: a run continued after it was found
(ERROR -> QUEUED) is live, and kept. Rows are locked member runs first, then their teams, the
order in which a member's commit and its team's fan-in take them, so a prune never deadlocks
with a fan-in; within a level, in run_id order, so two prunes never deadlock with each other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, exists, select

from orchestrator.errors import RunLiveError
from orchestrator.status import RunStatus
from orchestrator.store import metrics
from orchestrator.store.listing import RunFilter, ordered
from orchestrator.store.store import Store
from orchestrator.store.tables import (
    deltas,
    events,
    messages,
    requirements,
    runs,
    sessions,
    tool_starts,
    webhook_deliveries,
)
from orchestrator.store.teams import LIVE

#: Statuses a run may be deleted in: it stopped and waits on nobody.
STOPPED = tuple(s for s in RunStatus if s not in LIVE)
#: Top-level runs a prune batch takes at most (with their member runs).
BATCH = 100
#: Messages a batch deletes at most, past its first run's: keeps each transaction short.
MESSAGE_BUDGET = 5000
#: Ids per IN list (below both databases' limits on bound parameters).
_IDS = 500
_TREE = (runs.c.run_id, runs.c.parent_run_id, runs.c.status, runs.c.updated_at, runs.c.stream)


@dataclass(frozen=True, kw_only=True)
class Deleted:
    """What a delete removed."""

    #: Runs deleted, member runs included.
    runs: int = 0
    #: The deleted runs started with stream=True (whose Redis streams go too).
    streamed: tuple[str, ...] = ()
    #: Top-level runs a prune passed over: a run of their tree was live, or changed since the cut.
    kept: tuple[str, ...] = ()

    def __add__(self, other: Deleted) -> Deleted:
        return Deleted(
            runs=self.runs + other.runs, streamed=self.streamed + other.streamed, kept=self.kept + other.kept
        )


OnDeleted = Callable[[Deleted], None]


def prune(
    store: Store,
    *,
    cutoff: float,
    statuses: Sequence[RunStatus] = STOPPED,
    batch: int = BATCH,
    on_deleted: OnDeleted | None = None,
) -> Deleted:
    """Delete the top-level runs in `statuses` (all stopped) last updated before `cutoff`, with
    their member runs, oldest first, in batches; a tree with a live run, or one updated since
    `cutoff`, is kept. `on_deleted` is called after each batch commits."""
    if live := [s.value for s in statuses if s in LIVE]:
        raise ValueError(f"prune never deletes live runs ({', '.join(live)})")
    # Created before the cut too (updated_at >= created_at): what makes it one index range a status.
    found = RunFilter(statuses=tuple(statuses), until=cutoff, updated_before=cutoff)
    columns = ("run_id", "created_at", "n_messages")
    total, after = Deleted(), None
    while True:
        query = ordered(found, columns=columns, limit=batch, after=after, newest_first=False)
        with store.quick_engine.connect() as conn:
            roots = conn.execute(*query).all()
        if not roots:
            return total
        after = (roots[-1].created_at, roots[-1].run_id)  # past kept trees too: every pass ends
        while roots:
            chunk, roots = _budgeted(roots)
            with store.engine.begin() as conn:
                done = _prune_trees(conn, [r.run_id for r in chunk], cutoff, statuses)
            if on_deleted is not None:
                on_deleted(done)
            total += done


def _prune_trees(conn: Connection, roots: list[str], cutoff: float, statuses: Sequence[RunStatus]) -> Deleted:
    """Delete the trees of `roots` that may go, in the caller's transaction."""
    levels = _levels(conn, roots)
    tops = set(roots)
    root_of = {r: r for r in roots}
    for level in levels[1:]:
        root_of.update((row.run_id, root_of[row.parent_run_id]) for row in level)
    wanted = {s.value for s in statuses}

    def unfit(rows: Iterable[Any]) -> set[str]:
        """The trees of `rows` that must be kept: a run in them is live, or moved since `cutoff`,
        or their top-level run left the statuses asked for."""
        return {
            root_of[r.run_id]
            for r in rows
            if r.status in LIVE or r.updated_at >= cutoff or (r.run_id in tops and r.status not in wanted)
        }

    kept = unfit(row for level in levels for row in level)  # first look: no lock taken on them
    locked: dict[str, Any] = {}
    for level in reversed(levels):  # members before their teams (see the module's docstring)
        ids = sorted(row.run_id for row in level if root_of[row.run_id] not in kept)
        for part in _parts(ids):
            query = select(*_TREE).where(runs.c.run_id.in_(part)).order_by(runs.c.run_id).with_for_update()
            locked.update((row.run_id, row) for row in conn.execute(query))
    # Under lock: as found, and no member added since (a team adds members only while it is live).
    kept |= unfit(locked.values())
    kept |= {root_of[i] for i in root_of if root_of[i] not in kept and i not in locked}
    for part in _parts(list(locked)):
        added = conn.execute(select(runs.c.run_id, runs.c.parent_run_id).where(runs.c.parent_run_id.in_(part)))
        kept |= {root_of[row.parent_run_id] for row in added if row.run_id not in root_of}
    gone = [i for i in locked if root_of[i] not in kept]
    delete_runs(conn, gone)
    streamed = tuple(i for i in gone if locked[i].stream)
    return Deleted(runs=len(gone), streamed=streamed, kept=tuple(r for r in roots if r in kept))


def _levels(conn: Connection, roots: list[str]) -> list[list[Any]]:
    """The runs of the trees of `roots`: the roots, their members, the members' members..."""
    levels = [[row for part in _parts(roots) for row in conn.execute(select(*_TREE).where(runs.c.run_id.in_(part)))]]
    while parents := [row.run_id for row in levels[-1]]:
        query = [select(*_TREE).where(runs.c.parent_run_id.in_(part)) for part in _parts(parents)]
        children = [row for q in query for row in conn.execute(q)]
        if not children:
            break
        levels.append(children)
    return levels


def delete_session(
    store: Store, session_id: str, *, batch: int = BATCH, on_deleted: OnDeleted | None = None
) -> Deleted | None:
    """Delete the session: every run in it (member runs included) and the session itself, in
    batches. None if there is no such session; RunLiveError, before anything is deleted, if a
    run in it is live (and, if one becomes live meanwhile, when the batch finds it). A run
    started in the session while it is deleted is found by the next batch (and refused, being
    QUEUED), or, if it is written after the session row went, fails on the missing session."""
    with store.quick_engine.connect() as conn:
        if conn.execute(select(sessions.c.session_id).where(sessions.c.session_id == session_id)).first() is None:
            return None
        live = conn.execute(
            select(runs.c.run_id, runs.c.status)
            .where(runs.c.session_id == session_id, runs.c.status.in_([s.value for s in LIVE]))
            .limit(1)
        ).first()
    if live is not None:
        raise _live(session_id, live, done=0)
    total = Deleted()
    while True:
        with store.engine.begin() as conn:
            rows = conn.execute(
                select(runs.c.run_id, runs.c.status, runs.c.stream, runs.c.n_messages)
                .where(runs.c.session_id == session_id)
                .order_by(runs.c.run_id)
                .limit(batch)
                .with_for_update()
            ).all()
            if going := next((r for r in rows if r.status in LIVE), None):
                raise _live(session_id, going, done=total.runs)
            if not rows:
                # Not if a run was written in it since: the next batch finds that run.
                alone = ~exists().where(runs.c.session_id == session_id)
                this = sessions.c.session_id == session_id
                if conn.execute(delete(sessions).where(this, alone)).rowcount:
                    return total
                if conn.execute(select(sessions.c.session_id).where(this)).first() is None:
                    return total  # deleted by somebody else meanwhile
                continue
            chunk, _ = _budgeted(rows)
            delete_runs(conn, [r.run_id for r in chunk])
            done = Deleted(runs=len(chunk), streamed=tuple(r.run_id for r in chunk if r.stream))
        if on_deleted is not None:
            on_deleted(done)
        total += done


def _live(session_id: str, row: Any, *, done: int) -> RunLiveError:
    already = f"; {done} of its runs were deleted before it was found" if done else ""
    return RunLiveError(
        f"session {session_id!r} has a live run, {row.run_id} ({row.status}): nothing live is deleted{already}. "
        f"Cancel it (`ratchet cancel {row.run_id}`) or let it stop, then delete the session again",
        run_id=row.run_id,
    )


def delete_runs(conn: Connection, run_ids: Sequence[str]) -> None:
    """Delete these runs and every row stored for them, in the caller's transaction; what their
    rows added to the metrics' counters stays counted (`metrics.keep_counted`)."""
    for part in _parts(list(run_ids)):
        metrics.keep_counted(conn, part)
        for table in (messages, tool_starts, requirements, events, deltas, webhook_deliveries):
            conn.execute(delete(table).where(table.c.run_id.in_(part)))
        conn.execute(delete(runs).where(runs.c.run_id.in_(part)))


def _budgeted(rows: Sequence[Any]) -> tuple[Sequence[Any], Sequence[Any]]:
    """The first rows whose messages fit MESSAGE_BUDGET (at least one), and the rest."""
    count = 0
    for i, row in enumerate(rows):
        count += row.n_messages
        if i and count > MESSAGE_BUDGET:
            return rows[:i], rows[i:]
    return rows, []


def _parts(ids: list[str]) -> list[list[str]]:
    return [ids[i : i + _IDS] for i in range(0, len(ids), _IDS)]
