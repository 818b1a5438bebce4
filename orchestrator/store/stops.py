"""The runs a committed transaction stopped, handed to the process's observer of stops once the
commit is done (`Store.stops`; the run's span is emitted there, `orchestrator.tracing`).

A stop is noted in the transaction that writes it (`Store.move` to a final status, a step's final
commit) and handed on when its connection goes back to the pool after a commit: a transaction
rolled back hands on nothing, and one retried after a failed attempt hands on its stop once. As
with the announcements of final moves (`notify.py`), a COMMIT that fails after its event hands
on a stop that did not happen; the observer must expect that, rarely.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy import event as sa_event

from orchestrator.run import RunRecord

log = logging.getLogger("ratchet.store")
#: `Connection.info` keys: the stops the open transaction wrote, and those of committed ones.
_NOTED, _COMMITTED = "ratchet_stops_noted", "ratchet_stops_committed"

Observer = Callable[[RunRecord], None]


class Stops:
    """The stops of one store's transactions, and who is told of them (`Store.stops`)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._observer: Observer | None = None
        self._listening = False
        self._lock = threading.Lock()

    def observe(self, observer: Observer | None) -> None:
        """Tell `observer` of every stop this process commits from now on (None: nobody)."""
        with self._lock:
            if observer is not None and not self._listening:
                hand_on(self._engine, lambda: self._observer)
                self._listening = True
            self._observer = observer

    def note(self, conn: Connection, record: RunRecord) -> None:
        """The caller's transaction moves the run to `record.status`: a stop, if that is final,
        handed on if the transaction commits; nothing while nobody observes."""
        if self._observer is not None and record.status.is_final:
            conn.info.setdefault(_NOTED, []).append(record)


def hand_on(engine: Engine, observer: Callable[[], Observer | None]) -> None:
    """Hand each stop `note` saw to `observer()` once its transaction committed (nothing while
    it gives None): listeners on `engine` and its pool. Errors of the observer are logged, never
    raised into the store."""

    @sa_event.listens_for(engine, "commit")
    def _commit(conn: Connection) -> None:
        if conn.invalidated:
            return
        noted = conn.info.pop(_NOTED, None)
        if noted:
            conn.info.setdefault(_COMMITTED, []).extend(noted)

    @sa_event.listens_for(engine, "rollback")
    def _rollback(conn: Connection) -> None:
        if not conn.invalidated:
            conn.info.pop(_NOTED, None)

    @sa_event.listens_for(engine.pool, "checkin")
    def _checkin(dbapi_conn: Any, record: Any) -> None:
        committed = record.info.pop(_COMMITTED, None) if record is not None else None
        observe = observer() if committed else None
        if not committed or observe is None:
            return
        for stopped in committed:
            try:
                observe(stopped)
            except Exception:  # an observer's failure must not fail the write that committed
                log.exception("run %s: the observer of its stop failed", stopped.run_id)
