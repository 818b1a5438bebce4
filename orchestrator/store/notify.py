"""Waking producers the moment a run stops, on PostgreSQL: LISTEN/NOTIFY.

Every move to a final status (COMPLETED, ERROR, CANCELLED, PAUSED) sends
`NOTIFY ratchet_final, '<run_id>'` in its own transaction, so the notice goes out exactly when
the move commits (and never for a move rolled back). A `FinalWatcher` per store and process
holds one connection that LISTENs and wakes the threads waiting for that run. `Client.wait`
still reads the run itself and polls slowly as a safety net, so a lost connection or notice
costs latency, never correctness. SQLite has no notifications: waiters poll.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import Connection, text

log = logging.getLogger("ratchet.store")
CHANNEL = "ratchet_final"
RETRY_AFTER_FAILURE = 30.0
_NOTIFY = text(f"SELECT pg_notify('{CHANNEL}', :run_id)")


def notify_final(conn: Connection, run_id: str) -> None:
    """Announce, when the caller's transaction commits, that the run reached a final status."""
    conn.execute(_NOTIFY, {"run_id": run_id})


class FinalWatcher:
    """One LISTEN connection, shared by every waiter of the process. Thread-safe."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        self._closed = False
        # When LISTEN last failed: for a while after, waiters poll at once instead of each one
        # waiting for a connection that will not come (PgBouncer in transaction mode, no slots).
        self._failed_at: float | None = None

    def subscribe(self, run_id: str, timeout: float = 2.0) -> threading.Event | None:
        """An event set when the run's final move commits; None if not listening (then poll).

        Subscribe before reading the run's status, so no notice can fall between the two."""
        with self._lock:
            if self._closed:
                return None
            if self._thread is None or not self._thread.is_alive():
                if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_AFTER_FAILURE:
                    return None
                self._listening.clear()
                self._thread = threading.Thread(target=self._listen, name="ratchet-final-watcher", daemon=True)
                self._thread.start()
            event = threading.Event()
            self._waiters.setdefault(run_id, set()).add(event)
        if not self._listening.wait(timeout):
            self.unsubscribe(run_id, event)
            return None
        return event

    def unsubscribe(self, run_id: str, event: threading.Event) -> None:
        with self._lock:
            events = self._waiters.get(run_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[run_id]

    @property
    def listening(self) -> bool:
        """Whether notices are being received right now."""
        return self._listening.is_set()

    def close(self) -> None:
        """Stop listening (the thread ends within a second)."""
        self._closed = True

    def _listen(self) -> None:
        conn: Any = None
        try:
            import psycopg

            conn = psycopg.connect(self._dsn, autocommit=True)
            conn.execute(f"LISTEN {CHANNEL}")
            self._listening.set()
            while not self._closed:
                for notice in conn.notifies(timeout=1.0):
                    with self._lock:
                        events = list(self._waiters.get(notice.payload, ()))
                    for event in events:
                        event.set()
        except Exception as exc:  # waiters fall back to polling; a later subscribe reconnects
            self._failed_at = time.monotonic()
            log.info("run notifications stopped (%s: %s); waiters poll", type(exc).__name__, exc)
        finally:
            self._listening.clear()
            with self._lock:
                everyone = [e for events in self._waiters.values() for e in events]
            for event in everyone:  # wake them so they poll instead of sleeping on a dead listener
                event.set()
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
