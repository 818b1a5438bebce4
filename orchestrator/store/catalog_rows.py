"""The agent catalog's rows: what each worker serves, by name and definition hash.

A worker writes the definitions it serves when it boots (`write`) and marks them seen while it
lives (`mark_seen`); producers, the API and the CLI read them (`read`, `latest`). A row is keyed
by (name, definition_hash), so two versions of one agent, an old and a new worker side by side,
are two rows. What the definition says is the caller's JSON (`orchestrator.catalog`), stored as
given: the store neither reads nor hashes it. Functions of a connection, the same on SQLite and
PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Row, and_, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from orchestrator.store.tables import agent_catalog

if TYPE_CHECKING:
    from orchestrator.store.backend import Backend
    from orchestrator.store.store import Store

c = agent_catalog.c


@dataclass(frozen=True, kw_only=True)
class Served:
    """One definition a worker serves, as it writes it."""

    name: str
    #: SHA-256 (hex) of `definition`, the key of this version of the agent.
    definition_hash: str
    #: "agent" or "team".
    kind: str
    #: The definition as canonical JSON (`orchestrator.catalog.Definition`).
    definition: str


@dataclass(frozen=True, kw_only=True)
class CatalogRow(Served):
    """One catalog row: a definition and when workers first and last said they serve it."""

    first_seen: float
    last_seen: float

    @classmethod
    def from_row(cls, row: Row[tuple[object, ...]]) -> CatalogRow:
        values = row._mapping
        return cls(
            name=values["name"],
            definition_hash=values["definition_hash"],
            kind=values["kind"],
            definition=values["definition"],
            first_seen=values["first_seen"],
            last_seen=values["last_seen"],
        )


_SEEN = (
    update(agent_catalog)
    .where(and_(c.name == bindparam("b_name"), c.definition_hash == bindparam("b_hash")))
    .values(last_seen=bindparam("b_now"))
)


def mark_seen(conn: Connection, served: Sequence[Served], now: float) -> int:
    """Set the rows of `served` last seen now; how many rows there were to mark."""
    marked = 0
    for item in served:  # one UPDATE each: rowcount of an executemany is not reliable everywhere
        marked += conn.execute(_SEEN, {"b_name": item.name, "b_hash": item.definition_hash, "b_now": now}).rowcount
    return marked


def write(conn: Connection, item: Served, now: float) -> None:
    """Write one definition as seen now: a new row (first seen now), or the existing one marked.
    Two workers of one version booting together race for the insert; the loser marks the row
    the winner wrote. Run it in a transaction of its own (a failed insert ends it on PostgreSQL)."""
    if mark_seen(conn, [item], now):
        return
    try:
        with conn.begin_nested():
            row = {"name": item.name, "definition_hash": item.definition_hash, "kind": item.kind}
            conn.execute(insert(agent_catalog).values(**row, definition=item.definition, first_seen=now, last_seen=now))
    except IntegrityError:
        mark_seen(conn, [item], now)


def read(conn: Connection, name: str | None = None, since: float | None = None) -> list[CatalogRow]:
    """The catalog's rows (those of `name` only, and seen at `since` or later, if given): by name,
    then most recently seen first."""
    query = select(agent_catalog)
    if name is not None:
        query = query.where(c.name == name)
    if since is not None:
        query = query.where(c.last_seen >= since)
    rows = conn.execute(query.order_by(c.name, c.last_seen.desc(), c.definition_hash))
    return [CatalogRow.from_row(r) for r in rows]


def latest(conn: Connection, name: str) -> CatalogRow | None:
    """The most recently seen definition of `name`, or None if no worker ever served it."""
    query = select(agent_catalog).where(c.name == name).order_by(c.last_seen.desc(), c.definition_hash).limit(1)
    row = conn.execute(query).first()
    return CatalogRow.from_row(row) if row is not None else None


def newest_live(conn: Connection, name: str, since: float) -> CatalogRow | None:
    """The most recently seen definition of `name` if a worker marked it seen at `since` or
    later (it is live), else None."""
    query = (
        select(agent_catalog)
        .where(c.name == name, c.last_seen >= since)
        .order_by(c.last_seen.desc(), c.definition_hash)
        .limit(1)
    )
    row = conn.execute(query).first()
    return CatalogRow.from_row(row) if row is not None else None


class Catalog:
    """The catalog's rows as the store writes and reads them (`Store.catalog`)."""

    def __init__(self, store: Store, backend: Backend) -> None:
        self._store = store
        self._backend = backend

    def write(self, served: Sequence[Served]) -> None:
        """Write the definitions a worker serves, seen now: a new one first seen now, a known one
        marked seen, in one transaction. In one order, by name and hash, whatever the worker's:
        two workers serving the same agents never lock their rows crosswise."""
        now = self._store.clock()
        with self._store.engine.begin() as conn:
            for item in sorted(served, key=lambda s: (s.name, s.definition_hash)):
                write(conn, item, now)

    def read(self, name: str | None = None, since: float | None = None) -> list[CatalogRow]:
        """The catalog's rows (of `name`, seen at `since` or later, if given): by name, most
        recently seen first."""
        return self._backend.quick(lambda c: read(c, name, since))

    def latest(self, name: str) -> CatalogRow | None:
        """The definition of `name` a worker served most recently, or None if none ever did."""
        return self._backend.quick(lambda c: latest(c, name))
