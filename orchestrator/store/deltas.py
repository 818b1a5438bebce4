"""Live events of streamed runs in `ratchet_deltas`, as rows: what the table delta sink
(`orchestrator.table_sink`) keeps for deployments without Redis (the embedded default: SQLite and
the filesystem broker). An event's body is stored as the JSON its sink gives; the store reads
nothing into it.

Rows are written on the store's lazy engine (on SQLite, committed without waiting for the disk:
a delta lost to an OS crash is a gap in a live view, never in the run) and read on its quick
one. Rows older than the TTL are deleted when a step starts streaming, so no sweeper is needed.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, insert, select

from orchestrator.store.store import Store
from orchestrator.store.tables import deltas


class DeltaRows:
    """The `ratchet_deltas` table of one store."""

    def __init__(self, store: Store, *, ttl: float) -> None:
        self.store = store
        self.ttl = ttl

    def write(self, run_id: str, event_id: str, body: str, *, first_of_step: bool) -> None:
        """Insert one event's row; the first of a step also deletes rows older than the TTL."""
        now = self.store.clock()
        with self.store.lazy_engine.begin() as conn:
            if first_of_step:  # once per step at most
                conn.execute(delete(deltas).where(deltas.c.created_at < now - self.ttl))
            conn.execute(insert(deltas).values(run_id=run_id, event_id=event_id, body=body, created_at=now))

    def read(self, run_id: str, after: int | None) -> list[tuple[int, str]]:
        """The run's rows after the row id `after` (None: from the first kept), in the order
        written: each as (row id, body)."""
        query = select(deltas.c.id, deltas.c.body).where(deltas.c.run_id == run_id)
        if after is not None:
            query = query.where(deltas.c.id > after)
        with self.store.quick_engine.connect() as conn:
            return [(r.id, r.body) for r in conn.execute(query.order_by(deltas.c.id)).all()]

    def discard(self, run_ids: Sequence[str]) -> None:
        """Delete the runs' rows (a delete of the runs from the store already did, in its batch)."""
        with self.store.engine.begin() as conn:
            for i in range(0, len(run_ids), 500):
                conn.execute(delete(deltas).where(deltas.c.run_id.in_(run_ids[i : i + 500])))
