"""The run store on a SQLite file (WAL mode; see `database.py` for how its engine is tuned).

Every write transaction begins with `BEGIN IMMEDIATE`, so writers queue on the database lock;
reads begin with a plain BEGIN and neither wait for a writer nor hold one up. The claim and lease
renewals commit without their fsync. SQLite has no notifications: producers waiting for a run
poll it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, insert
from sqlalchemy.dialects import sqlite

from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.store import claims, statements
from orchestrator.store.claims import Claim
from orchestrator.store.database import SQLITE_READS, open_engine
from orchestrator.store.notify import FinalWatcher
from orchestrator.store.schema import runs, sessions
from orchestrator.store.store import Store

T = TypeVar("T")


class SqliteStore(Store):
    """`Store` on a SQLite file shared by the processes of one host."""

    def _open_quick_engine(self) -> Engine:
        """The same pool as `engine`, its transactions begun with a plain BEGIN."""
        return self.engine.execution_options(**{SQLITE_READS: True})

    def _open_lazy_engine(self) -> Engine:
        """A pool of its own at `synchronous=NORMAL`, so the claim and lease renewals do not wait
        for an fsync (as the claim on PostgreSQL does not wait for its WAL flush). The next synced
        commit flushes the WAL in order, these first."""
        return open_engine(self.engine.url.render_as_string(hide_password=False), sqlite_synchronous="NORMAL")

    def _quick(self, work: Callable[[Connection], T]) -> T:
        with self.quick_engine.connect() as conn:
            return work(conn)

    def _lazy(self, work: Callable[[Connection], T]) -> T:
        with self.lazy_engine.begin() as conn:  # BEGIN IMMEDIATE, committed without its fsync
            return work(conn)

    def _one_statement(self) -> AbstractContextManager[Connection]:
        return self.engine.begin()

    def _create(self, conn: Connection, values: dict[str, Any], input_messages: Sequence[Message]) -> RunRecord:
        now = values["created_at"]
        conn.execute(
            sqlite.insert(sessions).values(session_id=values["session_id"], created_at=now).on_conflict_do_nothing()
        )
        record = RunRecord.from_row(conn.execute(insert(runs).values(**values).returning(*runs.c)).one())
        self._insert_messages(conn, record.run_id, 0, input_messages, now, seq=record.seq, epoch=record.epoch)
        return record

    def _claim_on(self, conn: Connection, params: dict[str, Any]) -> Claim | None:
        row = conn.execute(statements.CLAIM, params).first()
        if row is None:
            return None
        record = RunRecord.from_row(row)
        return Claim(record=record, transcript=claims.transcript(conn, self.transcripts, record))

    def _commit(
        self, conn: Connection, claim: Claim, params: dict[str, Any], new_messages: Sequence[Message], *, final: bool
    ) -> RunRecord | None:
        row = conn.execute(statements.COMMIT, params).first()
        if row is None:
            return None
        record = RunRecord.from_row(row)
        start = record.n_messages - len(new_messages)
        self._insert_messages(
            conn, claim.run_id, start, new_messages, params["b_now"], seq=claim.record.seq, epoch=claim.epoch
        )
        return record

    def _on_final(self, conn: Connection, run_id: str) -> None:
        """Nothing to send: waiters poll."""

    def final_watcher(self) -> FinalWatcher | None:
        return None

    def _dispose(self) -> None:
        self.engine.dispose(close=False)  # the quick engine shares its pool
        self.lazy_engine.dispose(close=False)
