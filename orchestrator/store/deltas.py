"""The delta sink on the run store: live events of streamed runs in `ratchet_deltas`, for
deployments without Redis (the embedded default: SQLite and the filesystem broker).

Rows are written on the store's lazy engine (on SQLite, committed without waiting for the disk:
a delta lost to an OS crash is a gap in a live view, never in the run) and read on its quick
one. Rows older than the TTL are deleted when a step starts streaming, so no sweeper is needed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import delete, insert, select

from orchestrator.events import RunEvent
from orchestrator.store.store import Store
from orchestrator.store.tables import deltas


class TableDeltaSink:
    """A `DeltaSink` (orchestrator.ports) on the store's `ratchet_deltas` table."""

    def __init__(self, store: Store, *, ttl: float) -> None:
        self.store = store
        self.ttl = ttl

    def write(self, event: RunEvent) -> None:
        """Insert the event; the first event of a step also deletes rows older than the TTL."""
        now = self.store.clock()
        with self.store.lazy_engine.begin() as conn:
            if event.key[3] <= 1:  # a step's StepRestarted or first delta: once per step at most
                conn.execute(delete(deltas).where(deltas.c.created_at < now - self.ttl))
            conn.execute(
                insert(deltas).values(
                    run_id=event.run_id, event_id=event.id, body=event.model_dump_json(), created_at=now
                )
            )

    def read(self, run_id: str, cursor: str | None) -> tuple[list[RunEvent], str | None]:
        """The run's rows after the row id `cursor`, in the order written."""
        query = select(deltas.c.id, deltas.c.body).where(deltas.c.run_id == run_id)
        if cursor is not None:
            query = query.where(deltas.c.id > int(cursor))
        with self.store.quick_engine.connect() as conn:
            rows = conn.execute(query.order_by(deltas.c.id)).all()
        if not rows:
            return [], cursor
        return [RunEvent.model_validate_json(r.body) for r in rows], str(rows[-1].id)

    def wait(self, run_id: str, cursor: str | None, timeout: float) -> tuple[list[RunEvent], str | None]:
        """Sleep `timeout` seconds: a table cannot be blocked on, so a reader polls it."""
        time.sleep(timeout)
        return [], cursor

    def discard(self, run_ids: Sequence[str]) -> None:
        """Delete the runs' rows (a delete of the runs from the store already did, in its batch)."""
        with self.store.engine.begin() as conn:
            for i in range(0, len(run_ids), 500):
                conn.execute(delete(deltas).where(deltas.c.run_id.in_(run_ids[i : i + 500])))

    def flush(self, run_id: str) -> None:
        """Nothing to do: `write` stores each event before it returns."""
