"""The delta sink on the run store (`DeltaSink`, `orchestrator.ports`): a streamed run's live
events as rows of `ratchet_deltas` (`orchestrator.store.deltas`), for deployments without Redis.
A reader polls it: a table cannot be blocked on."""

from __future__ import annotations

import time
from collections.abc import Sequence

from orchestrator.events import RunEvent
from orchestrator.store import Store
from orchestrator.store.deltas import DeltaRows


class TableDeltaSink:
    """A `DeltaSink` on the store's `ratchet_deltas` table; rows older than `ttl` seconds go."""

    def __init__(self, store: Store, *, ttl: float) -> None:
        self.rows = DeltaRows(store, ttl=ttl)

    def write(self, event: RunEvent) -> None:
        """Store the event before returning (a step's StepRestarted or first delta also prunes)."""
        self.rows.write(event.run_id, event.id, event.model_dump_json(), first_of_step=event.key[3] <= 1)

    def read(self, run_id: str, cursor: str | None) -> tuple[list[RunEvent], str | None]:
        """The run's events after the row id `cursor`, in the order written."""
        rows = self.rows.read(run_id, None if cursor is None else int(cursor))
        if not rows:
            return [], cursor
        return [RunEvent.model_validate_json(body) for _, body in rows], str(rows[-1][0])

    def wait(self, run_id: str, cursor: str | None, timeout: float) -> tuple[list[RunEvent], str | None]:
        """Sleep `timeout` seconds: a table cannot be blocked on, so a reader polls it."""
        time.sleep(timeout)
        return [], cursor

    def discard(self, run_ids: Sequence[str]) -> None:
        """Delete the runs' rows."""
        self.rows.discard(run_ids)

    def flush(self, run_id: str) -> None:
        """Nothing to do: `write` stores each event before it returns."""
