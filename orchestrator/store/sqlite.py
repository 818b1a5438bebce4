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

from sqlalchemy import Connection, Engine

from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import claims, deciding, direct, sessions, statements, webhook_rows, writes
from orchestrator.store.backend import Backend
from orchestrator.store.claims import Claim
from orchestrator.store.database import SQLITE_READS, open_engine
from orchestrator.store.notify import FinalWatcher, announce_after_commit, note_final
from orchestrator.store.transcripts import TranscriptCache

T = TypeVar("T")


class SqliteBackend(Backend):
    """The store on a SQLite file shared by the processes of one host."""

    def __init__(self, engine: Engine) -> None:
        # Reads: the same pool, their transactions begun with a plain BEGIN. Lazy writes: a pool
        # of its own at synchronous=NORMAL, so the claim and lease renewals do not wait for an
        # fsync (as the claim on PostgreSQL does not wait for its WAL flush); the next synced
        # commit flushes the WAL in order, these first.
        lazy = open_engine(engine.url.render_as_string(hide_password=False), sqlite_synchronous="NORMAL")
        super().__init__(engine, quick_engine=engine.execution_options(**{SQLITE_READS: True}), lazy_engine=lazy)
        announce_after_commit(engine, lambda: self.announce)

    def quick(self, work: Callable[[Connection], T]) -> T:
        with self.quick_engine.connect() as conn:
            return work(conn)

    def lazy(self, work: Callable[[Connection], T]) -> T:
        with self.lazy_engine.begin() as conn:  # BEGIN IMMEDIATE, committed without its fsync
            return work(conn)

    def single_statement(self) -> AbstractContextManager[Connection]:
        return self.engine.begin()

    def create(self, conn: Connection, values: dict[str, Any], input_messages: Sequence[Message]) -> RunRecord:
        now = values["created_at"]
        # Prebuilt: building an insert of 24 values costs more than running it (bench/FINDINGS.md).
        session = {"session_id": values["session_id"], "created_at": now, "user_id": values["user_id"]}
        direct.rows(conn, statements.CREATE_SESSION, session)
        # Compared in the transaction that writes the run, which holds the database lock from BEGIN
        # IMMEDIATE: a first run of the session for another user cannot commit in between.
        owner = direct.first(conn, statements.SESSION_OWNER, {"b_session_id": values["session_id"]})
        if owner.user_id != values["user_id"]:
            raise sessions.refused(values["session_id"])
        row = direct.first(conn, statements.CREATE_RUN, values)
        assert row is not None  # an INSERT ... RETURNING that did not raise
        record = RunRecord.from_row(row)
        writes.insert_messages(conn, record.run_id, 0, input_messages, now, seq=record.seq, epoch=record.epoch)
        return record

    def lock_names(self, conn: Connection, names: Sequence[str]) -> None:
        pass  # the write transaction holds the database's lock from BEGIN IMMEDIATE on: one at a time already

    def claim(self, conn: Connection, params: dict[str, Any], cache: TranscriptCache) -> Claim | None:
        row = direct.first(conn, statements.CLAIM, params)
        if row is None:
            return None
        record = RunRecord.from_row(row)
        return Claim(record=record, transcript=claims.transcript(conn, cache, record))

    def commit(
        self, conn: Connection, params: dict[str, Any], new_messages: Sequence[Message], *, seq: int, final: bool
    ) -> RunRecord | None:
        row = direct.first(conn, statements.COMMIT, params)
        if row is None:
            return None
        record = RunRecord.from_row(row)
        if final:
            note_final(conn, record.run_id)
            webhook_rows.enqueue(conn, record)
        if params["b_status"] == RunStatus.COMPLETED.value:  # what the metrics count as completed
            logged = {"b_run_id": record.run_id, "b_now": params["b_now"], "b_step": seq}
            direct.many(conn, statements.LOG_COMPLETED, [logged])
        start = record.n_messages - len(new_messages)
        writes.insert_messages(
            conn,
            record.run_id,
            start,
            new_messages,
            params["b_now"],
            seq=seq,
            epoch=record.epoch,
            step_started_at=params["b_started"],
            step_queued_at=params["b_queued"],
            definition_hash=params["b_definition"],
        )
        return record

    def decide_at_once(self, bound: dict[str, Any]) -> deciding.AtOnce | None:
        with self.engine.begin() as conn:  # BEGIN IMMEDIATE: the database lock orders the deciders
            return deciding.decide_sqlite(conn, bound)

    def on_final(self, conn: Connection, run_id: str) -> None:
        note_final(conn, run_id)

    def final_watcher(self) -> FinalWatcher | None:
        return None

    @property
    def announces_finals(self) -> bool:
        return True

    def dispose(self, *, close: bool) -> None:
        self.engine.dispose(close=close)  # the quick engine shares its pool
        self.lazy_engine.dispose(close=close)
