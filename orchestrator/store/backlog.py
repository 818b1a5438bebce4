"""Bounds on the runs waiting for a worker, applied by each start that would add one
(`Store.backlog`).

A bound (`Bound`) is a scope ("agent" or "user"), its key (the agent's name, the run's user_id)
and a limit. `create` writes a new run only while, for each bound, fewer than its limit of that
key's runs are QUEUED, counted in the transaction that writes the run; otherwise it writes
nothing and raises QueueFullError.

Starts under one key are counted one at a time. On PostgreSQL each first takes a lock on each of
its bounds' keys that its transaction holds to the end (`Backend.lock_names`: an advisory lock),
in one order (the agent's, then the user's), and runs READ COMMITTED, so a count made after the
lock was granted sees every run committed before that. On SQLite the transaction holds the
database's write lock from BEGIN IMMEDIATE on. So starts at the same time never together take a
key past its limit. What else moves runs into QUEUED is never refused (a run going on between
its steps, a continue, a team's member, a fork) and can take the count past the limit: starts
are then refused until it falls below.

The count reads at most `limit` rows, off the index on (status, publish_after) that the sweeper
reads QUEUED runs by: its cost is bounded by the limit, not by the runs stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Connection, func, literal, select

from orchestrator.errors import QueueFullError
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store.tables import runs

if TYPE_CHECKING:
    from orchestrator.store.backend import Backend
    from orchestrator.store.store import Store


@dataclass(frozen=True, kw_only=True)
class Bound:
    """At most `limit` runs of `key` (an agent's name, or a user_id) QUEUED for a start to be
    taken; `named` says what set the limit, for the refusal (`max_queued=3`, a setting)."""

    scope: Literal["agent", "user"]
    key: str
    limit: int
    named: str

    @property
    def lock_name(self) -> str:
        """The name of the lock starts under this key take, one at a time."""
        return f"ratchet.queued:{self.scope}:{self.key}"

    def refusal(self, queued: int) -> QueueFullError:
        """The error a start refused by this bound raises, `queued` runs being QUEUED."""
        whose = f"agent {self.key!r}" if self.scope == "agent" else f"user_id {self.key!r}"
        return QueueFullError(
            f"{whose} has {queued} runs QUEUED, waiting for a worker, and {self.named} allows no more: this "
            "start was refused and nothing was written. Send it again once workers have taken some (add "
            "workers if they are behind), or raise the bound",
            scope=self.scope,
            limit=self.limit,
            queued=queued,
        )


class Backlog:
    """New runs written under their bounds (see above)."""

    def __init__(self, store: Store, backend: Backend) -> None:
        self._store = store
        self._backend = backend

    def create(self, bounds: Sequence[Bound], **run: Any) -> RunRecord:
        """`Store.create_run(**run)` in a transaction that first counts each bound's QUEUED runs
        under its lock: QueueFullError, and nothing written, when one has its limit."""
        ordered = sorted(bounds, key=lambda b: (b.scope != "agent", b.key))
        with self._store.engine.begin() as conn:
            self._backend.lock_names(conn, [b.lock_name for b in ordered])
            for bound in ordered:
                queued = count(conn, bound)
                if queued >= bound.limit:
                    raise bound.refusal(queued)
            return self._store.create_run(conn=conn, **run)

    def queued(self, bound: Bound) -> int:
        """How many of the bound's key's runs are QUEUED now, counted up to its limit."""
        return self._backend.quick(lambda conn: count(conn, bound))


def count(conn: Connection, bound: Bound) -> int:
    """The QUEUED runs of the bound's key, up to its limit (no more rows are read)."""
    column = runs.c.agent_name if bound.scope == "agent" else runs.c.user_id
    found = (
        select(literal(1))
        .select_from(runs)
        .where(runs.c.status == RunStatus.QUEUED.value, column == bound.key)
        .limit(bound.limit)
        .subquery()
    )
    return int(conn.execute(select(func.count()).select_from(found)).scalar_one())
