"""Waking producers the moment a run stops, on PostgreSQL: LISTEN/NOTIFY.

Every move to a final status (COMPLETED, ERROR, CANCELLED, PAUSED) sends
`NOTIFY ratchet_final, '<run_id>'` in its own transaction, so the notice goes out exactly when
the move commits (and never for a move rolled back). A `FinalWatcher` per store and process
holds one connection that LISTENs and wakes the threads waiting for that run. `Client.wait`
still reads the run itself and polls slowly as a safety net, so a lost connection or notice
costs latency, never correctness.

SQLite has no notifications: waiters poll. Where the broker is Redis, the store announces each
run's final move once its transaction committed (`announce_after_commit`, through the announcer
`orchestrator.runtime` gives it), and `Client.wait` wakes on the announcement between
its polls: an announcement lost (a crash right after the commit, Redis down) costs nothing but
the wait for the next poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy import event as sa_event

log = logging.getLogger("ratchet.store")
CHANNEL = "ratchet_final"
RETRY_AFTER_FAILURE = 30.0
_NOTIFY = text(f"SELECT pg_notify('{CHANNEL}', :run_id)")


def notify_final(conn: Connection, run_id: str) -> None:
    """Announce, when the caller's transaction commits, that the run reached a final status."""
    conn.execute(_NOTIFY, {"run_id": run_id})


#: `Connection.info` keys (kept with the pooled connection): the runs the open transaction moved
#: to a final status, and those of committed transactions, announced when it goes back to the pool.
_MOVED, _COMMITTED = "ratchet_final_moved", "ratchet_final_committed"


def note_final(conn: Connection, run_id: str) -> None:
    """SQLite: the caller's transaction moves the run to a final status (announced if it commits)."""
    conn.info.setdefault(_MOVED, []).append(run_id)


def announce_after_commit(engine: Engine, announcer: Callable[[], Callable[[list[str]], None] | None]) -> None:
    """Announce the runs `note_final` saw, through `announcer()` (nothing while it gives None),
    once their transaction committed: when its connection goes back to the pool. A transaction
    rolled back announces nothing; one whose COMMIT fails after the event announces a run that
    did not move, and its waiters read it and go on waiting."""

    # An invalidated connection (an exit exception raised inside a statement) is not asked for
    # its `info`: that would raise PendingRollbackError in place of the exception on its way out.
    # The pool clears the record's info when it reconnects, so nothing noted is left behind.

    @sa_event.listens_for(engine, "commit")
    def _commit(conn: Connection) -> None:
        if conn.invalidated:
            return
        moved = conn.info.pop(_MOVED, None)
        if moved:
            conn.info.setdefault(_COMMITTED, []).extend(moved)

    @sa_event.listens_for(engine, "rollback")
    def _rollback(conn: Connection) -> None:
        if not conn.invalidated:
            conn.info.pop(_MOVED, None)

    @sa_event.listens_for(engine.pool, "checkin")
    def _checkin(dbapi_conn: Any, record: Any) -> None:
        committed = record.info.pop(_COMMITTED, None) if record is not None else None
        announce = announcer() if committed else None
        if committed and announce is not None:
            try:
                announce(committed)
            except Exception as exc:  # a wake-up only: the waiters' polls still see the runs stop
                log.debug("runs %s: final moves not announced (%s)", committed, exc)


class Listener:
    """One connection listening for runs that reached a final status, shared by every waiter of
    the process, which it wakes. Thread-safe. A subclass connects and hands over what it hears
    (`_receive`); this class keeps the waiters, the listening thread and its failures."""

    #: The listening thread's name.
    thread_name = "ratchet-final-watcher"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[str, set[threading.Event]] = {}
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()
        #: Set once the thread listens or has failed: what a `subscribe` waits for.
        self._settled = threading.Event()
        self._closed = False
        # When listening last failed: for a while after, waiters poll at once instead of each one
        # waiting for a connection that will not come (PgBouncer in transaction mode, no slots).
        self._failed_at: float | None = None

    def subscribe(self, run_id: str, timeout: float = 2.0) -> threading.Event | None:
        """An event set when the run's final move is heard; None if not listening (then poll).

        Subscribe before reading the run's status, so no notice can fall between the two."""
        with self._lock:
            if self._closed:
                return None
            if self._thread is None or not self._thread.is_alive():
                if self._failed_at is not None and time.monotonic() - self._failed_at < RETRY_AFTER_FAILURE:
                    return None
                self._listening.clear()
                self._settled.clear()
                self._thread = threading.Thread(target=self._listen, name=self.thread_name, daemon=True)
                self._thread.start()
            event = threading.Event()
            self._waiters.setdefault(run_id, set()).add(event)
        self._settled.wait(timeout)
        if not self._listening.is_set():
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

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop listening (the thread ends within a second)."""
        self._closed = True

    def _receive(self) -> None:
        """Connect, call `_ready` once listening, then `_heard` with each run id until `closed`."""
        raise NotImplementedError

    def _ready(self) -> None:
        self._failed_at = None
        self._listening.set()
        self._settled.set()

    def _heard(self, run_id: str) -> None:
        with self._lock:
            events = list(self._waiters.get(run_id, ()))
        for event in events:
            event.set()

    def _listen(self) -> None:
        try:
            self._receive()
        except Exception as exc:  # waiters fall back to polling; a later subscribe reconnects
            self._failed_at = time.monotonic()
            log.info("run notifications stopped (%s: %s); waiters poll", type(exc).__name__, exc)
        finally:
            self._listening.clear()
            self._settled.set()
            with self._lock:
                everyone = [e for events in self._waiters.values() for e in events]
            for event in everyone:  # wake them so they poll instead of sleeping on a dead listener
                event.set()


class FinalWatcher(Listener):
    """PostgreSQL: one LISTEN connection."""

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self._dsn = dsn

    def _receive(self) -> None:
        import psycopg

        with psycopg.connect(self._dsn, autocommit=True) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self._ready()
            while not self.closed:
                for notice in conn.notifies(timeout=1.0):
                    self._heard(notice.payload)
