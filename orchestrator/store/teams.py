"""The store's reads for team runs and their member runs (used by `orchestrator.delegation`).

Writes still go through `Store`'s guarded moves; these are the two reads the fan-in needs that
are more than a plain select: the team row locked for the length of the caller's transaction,
and the sweeper's search for teams a crash left waiting.
"""

from __future__ import annotations

from sqlalchemy import Connection, and_, exists, not_, or_, select
from sqlalchemy.orm import aliased

from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store.tables import runs

S = RunStatus
#: Statuses in which a member run may still end by itself.
LIVE = (S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED)


def lock_run(conn: Connection, run_id: str) -> RunRecord | None:
    """The run's row, locked until the caller's transaction ends.

    Two members finishing at once on two workers serialise here: on PostgreSQL on the row lock
    (the second waits, then reads the first one's commit); on SQLite every write transaction
    already holds the database lock from BEGIN IMMEDIATE, and FOR UPDATE renders as nothing."""
    row = conn.execute(select(runs).where(runs.c.run_id == run_id).with_for_update()).first()
    return RunRecord.from_row(row) if row is not None else None


def teams_to_fan_in(conn: Connection, *, limit: int = 200) -> list[str]:
    """WAITING runs whose fan-in is due: no delegated member is live any more, or one ended in
    ERROR. A fan-in that ran leaves its team QUEUED or ERROR, so these are the ones a crash
    interrupted (or that are being fanned in right now: doing it again is a no-op)."""
    child = aliased(runs)
    delegated = and_(child.c.parent_run_id == runs.c.run_id, child.c.parent_tool_call_id.is_not(None))
    live = exists().where(delegated, child.c.status.in_([s.value for s in LIVE]))
    failed = exists().where(delegated, child.c.status == S.ERROR.value)
    rows = conn.execute(
        select(runs.c.run_id)
        .where(runs.c.status == S.WAITING.value, or_(not_(live), failed))
        .order_by(runs.c.updated_at)
        .limit(limit)
    )
    return [r.run_id for r in rows]
