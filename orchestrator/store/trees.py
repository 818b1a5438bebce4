"""A run's tree (a team, its members, theirs): its top run, the lock every write in it takes
first, and which of its runs wait for a person. Functions of a connection, for the store's
components that move more than one run of a tree (`paused.py`, `teams.py`, `endings.py`).

Every write that moves more than one run of a tree, or decides for one, locks the row of the
tree's top run (its root) before any other row of the tree, so none holds a row another waits
for: a pause, a decision, a fan-in and a cancel take turns, and PostgreSQL never aborts one as
a deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Connection, select, update

from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import reads
from orchestrator.store.tables import requirements, runs

if TYPE_CHECKING:
    from orchestrator.store.store import Store

S = RunStatus


def ancestors(conn: Connection, record: RunRecord) -> list[RunRecord]:
    """The teams above the run, nearest first (none outside a team)."""
    chain: list[RunRecord] = []
    parent = record.parent_run_id
    while parent is not None and len(chain) < 64:
        team = reads.find_record(conn, parent)
        if team is None:
            break
        chain.append(team)
        parent = team.parent_run_id
    return chain


def lock(conn: Connection, run_id: str) -> bool:
    """Take the run's row lock for the rest of the transaction (a write that changes nothing);
    False if there is no such run."""
    done = conn.execute(update(runs).where(runs.c.run_id == run_id).values(updated_at=runs.c.updated_at))
    return bool(done.rowcount)


def lock_run(conn: Connection, run_id: str) -> RunRecord | None:
    """The run's row, locked until the caller's transaction ends.

    Two members finishing at once on two workers serialise here: on PostgreSQL on the row lock
    (the second waits, then reads the first one's commit); on SQLite every write transaction
    already holds the database lock from BEGIN IMMEDIATE, and FOR UPDATE renders as nothing."""
    row = conn.execute(select(runs).where(runs.c.run_id == run_id).with_for_update()).first()
    return RunRecord.from_row(row) if row is not None else None


def lock_root(conn: Connection, run_id: str) -> str:
    """Lock the row of the top run of `run_id`'s tree (its root) before any other row of the
    tree, and return the root's id: `lock`'s lock, by FOR UPDATE instead of a write (no row
    version; on SQLite nothing: its writers hold the database lock from BEGIN IMMEDIATE). Every
    write that moves more than one run of a tree takes it first, so none holds a row another one
    waits for."""
    root = run_id
    for _ in range(64):
        record = reads.find_record(conn, root)
        if record is None or record.parent_run_id is None:
            break
        root = record.parent_run_id
    conn.execute(select(runs.c.run_id).where(runs.c.run_id == root).with_for_update())
    return root


def waiting_below(conn: Connection, root: str, run_id: str) -> bool:
    """Whether the run, or a run under it at any depth, waits for a person: a pending requirement
    of a run that is PAUSED (a cancelled or failed run's pending rows wait for nobody)."""
    return any(run_id in chain for chain in pending_runs(conn, root))


def release(conn: Connection, store: Store, chain: Sequence[RunRecord], root: str) -> list[RunRecord]:
    """Move each team of `chain` (nearest first, paused for its members) PAUSED -> WAITING while
    nothing under it waits for a person, stopping at the first that still does; the teams moved.
    A team that is not PAUSED (in ERROR, say) is passed over."""
    moved: list[RunRecord] = []
    waiting = pending_runs(conn, root)
    for team in chain:
        if any(team.run_id in ids for ids in waiting):
            break
        record = store.move(
            team.run_id,
            src=(S.PAUSED,),
            dst=S.WAITING,
            event="resume",
            conn=conn,
            extra_where=runs.c.next_step.is_(None),
        )
        if record is not None:
            moved.append(record)
    return moved


def wake_teams(conn: Connection, store: Store, run: RunRecord, root: str) -> list[RunRecord]:
    """Move each PAUSED team above `run`, nearest first, back to WAITING while its tree has
    nothing pending (under the root's lock): `run` no longer waits for a person (decided, or
    cancelled). The teams moved."""
    return release(conn, store, ancestors(conn, run), root)


def pending_runs(conn: Connection, root: str) -> list[set[str]]:
    """For each PAUSED run of the tree under `root` with a pending requirement: it and its teams' ids."""
    query = (
        select(requirements.c.run_id)
        .join(runs, runs.c.run_id == requirements.c.run_id)
        .where(requirements.c.root_run_id == root, requirements.c.status == "pending")
        .where(runs.c.status == S.PAUSED.value)
        .distinct()
    )
    chains: list[set[str]] = []
    for (run_id,) in conn.execute(query):
        record = reads.find_record(conn, run_id)
        if record is not None:
            chains.append({run_id, *(team.run_id for team in ancestors(conn, record))})
    return chains
