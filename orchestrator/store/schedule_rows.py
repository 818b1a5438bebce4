"""Schedules' rows (`ratchet_schedules`): written, listed, deleted, and moved on tick by tick.

What fires them is `orchestrator.schedules`; this module only reads and writes rows, each call
one transaction. Moving a schedule on (`advance`) is one guarded UPDATE on the `next_at` its
caller read: of two sweepers firing the same tick, one moves it on and the other changes nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.engine import Row

from orchestrator.store.tables import schedules


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A schedule as stored: which agent it runs with what input, on which cron in which zone,
    the next tick due (`next_at`, UNIX seconds) and the last one fired with its run."""

    schedule_id: str
    agent_name: str
    cron: str
    timezone: str
    input: str
    session_id: str | None
    user_id: str | None
    created_at: float
    next_at: float
    last_tick: float | None = None
    last_run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The schedule as JSON-ready fields (the API's, the CLI's --json)."""
        return asdict(self)


class Schedules:
    """The store's schedules (`Store.schedules`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def add(self, schedule: Schedule) -> None:
        """Write a new schedule; IntegrityError if its id is taken."""
        with self.engine.begin() as conn:
            conn.execute(insert(schedules).values(**asdict(schedule)))

    def get(self, schedule_id: str) -> Schedule | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(schedules).where(schedules.c.schedule_id == schedule_id)).first()
        return None if row is None else _from_row(row)

    def all(self, *, user_id: str | None = None) -> list[Schedule]:
        """Every schedule (or one user's), by id."""
        query = select(schedules).order_by(schedules.c.schedule_id)
        if user_id is not None:
            query = query.where(schedules.c.user_id == user_id)
        with self.engine.connect() as conn:
            return [_from_row(row) for row in conn.execute(query)]

    def delete(self, schedule_id: str) -> bool:
        """Delete the schedule; whether there was one. The runs it started stay."""
        with self.engine.begin() as conn:
            return conn.execute(delete(schedules).where(schedules.c.schedule_id == schedule_id)).rowcount == 1

    def due(self, now: float) -> list[Schedule]:
        """The schedules whose next tick is at or before `now`, the most overdue first."""
        query = select(schedules).where(schedules.c.next_at <= now).order_by(schedules.c.next_at)
        with self.engine.connect() as conn:
            return [_from_row(row) for row in conn.execute(query)]

    def advance(self, schedule_id: str, *, read_next_at: float, next_at: float, tick: float, run_id: str) -> bool:
        """Move the schedule on to `next_at`, recording `tick` fired as `run_id`, if its next tick
        is still the one read (`read_next_at`); whether this call moved it."""
        guard = (schedules.c.schedule_id == schedule_id) & (schedules.c.next_at == read_next_at)
        values = {"next_at": next_at, "last_tick": tick, "last_run_id": run_id}
        with self.engine.begin() as conn:
            return conn.execute(update(schedules).where(guard).values(values)).rowcount == 1


def _from_row(row: Row[Any]) -> Schedule:
    return Schedule(**{c.name: getattr(row, c.name) for c in schedules.columns})
