"""Leases of jobs one process of the fleet does at a time (`ratchet_leases`): functions of a
connection, the same on SQLite and PostgreSQL.

A lease is taken by one guarded UPDATE: it goes to `owner` if it is free (expired, or let go) or
already `owner`'s, and to nobody else. On PostgreSQL two takers at once queue on the row's lock,
and the second sees the first's renewal, so at most one of them gets it; on SQLite the write lock
orders them the same way. A lease never taken has no row yet: the first taker inserts it, and a
second that inserts at the same moment fails on the primary key (`Store.hold_lease` reads that as
not held).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, insert, or_, select, update

from orchestrator.store.tables import leases


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A lease's row: who holds it (or last held it), until when, and when they last renewed it."""

    name: str
    owner: str
    expires_at: float
    renewed_at: float

    def held(self, now: float) -> bool:
        """Whether its holder still holds it at `now` (else anyone may take it)."""
        return self.expires_at > now


def take(conn: Connection, name: str, owner: str, *, now: float, seconds: float) -> bool:
    """Take or renew the lease `name` for `owner` until `now + seconds`, if it is free or already
    theirs; whether they hold it now. An IntegrityError if another inserted it at the same time."""
    values = {"owner": owner, "expires_at": now + seconds, "renewed_at": now}
    free = or_(leases.c.owner == owner, leases.c.expires_at <= now)
    if conn.execute(update(leases).where(leases.c.name == name, free).values(values)).rowcount == 1:
        return True
    if conn.execute(select(leases.c.name).where(leases.c.name == name)).first() is not None:
        return False  # someone else's, and live
    conn.execute(insert(leases).values(name=name, **values))
    return True


def release(conn: Connection, name: str, owner: str, *, now: float) -> bool:
    """Let the lease go if `owner` still holds it, so another may take it at once; whether they did.
    The row stays, with its owner and `renewed_at` now: the last time anyone held it."""
    held = (leases.c.name == name) & (leases.c.owner == owner) & (leases.c.expires_at > now)
    return conn.execute(update(leases).where(held).values(expires_at=now, renewed_at=now)).rowcount == 1


def read(conn: Connection, name: str) -> Lease | None:
    """The lease's row, or None if nobody ever took it."""
    row = conn.execute(select(leases).where(leases.c.name == name)).first()
    if row is None:
        return None
    return Lease(name=row.name, owner=row.owner, expires_at=row.expires_at, renewed_at=row.renewed_at)
