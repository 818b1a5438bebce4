"""Transient database errors: which they are, and writing again through them.

A failover, a dropped connection, an administrator's restart or SQLite's "database is locked"
fail one statement, not the step: the step's work (a paid-for model reply, a tool that took
effect) must not be thrown away for it. A durable write is tried again until a deadline; before
each new try it asks whether the last one landed after all (the connection can drop after the
server committed), so a retry never writes twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

log = logging.getLogger("ratchet.store")
T = TypeVar("T")

#: SQLite's words for a write that could not get the database lock in time.
#: PostgreSQL's read_only_sql_transaction: a write that reached a node still read-only in a failover.
_READ_ONLY = "25006"
_SQLITE_BUSY = ("database is locked", "database is busy", "database table is locked")


def is_transient(exc: BaseException) -> bool:
    """Whether trying the same statement again later may succeed.

    PostgreSQL: a connection the server or the network dropped, a server shutting down, a
    serialization failure or deadlock (all `OperationalError` or `InterfaceError` in psycopg).
    SQLite: only a busy or locked database; its other operational errors (a missing table, a
    read-only file) will not go away by waiting. Data and integrity errors never are."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    if getattr(exc.orig, "sqlstate", None) == _READ_ONLY:
        return True  # a failover's old primary, or a replica promoted a moment later
    if not isinstance(exc, OperationalError | InterfaceError):
        return False
    if type(exc.orig).__module__.startswith("sqlite3"):
        text = str(exc.orig).lower()
        return any(words in text for words in _SQLITE_BUSY)
    return True


def retry_transient(
    write: Callable[[], T],
    *,
    landed: Callable[[], T | None],
    within: float,
    what: str,
) -> T:
    """`write()`, tried again on transient errors for up to `within` seconds.

    Before each new try, `landed()` says whether the previous one committed after all (it
    returns what `write` would have, or None when it did not land). Non-transient errors, and the
    last transient one at the deadline, propagate."""
    deadline = time.monotonic() + within
    delay = 0.05
    attempt = write
    while True:
        try:
            return attempt()
        except DBAPIError as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("%s: transient database error (%s); trying again in %.2fs", what, _short(exc), delay)
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
        attempt = lambda: _landed_or(landed, write)  # noqa: E731


def _landed_or(landed: Callable[[], T | None], write: Callable[[], T]) -> T:
    found = landed()
    return found if found is not None else write()


def _short(exc: DBAPIError) -> str:
    # The driver's message only: SQLAlchemy's text carries the SQL and the step's messages.
    text = str(exc.orig).strip().splitlines()
    return f"{type(exc.orig).__name__}: {text[0] if text else ''}"
