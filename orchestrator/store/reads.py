"""The run store's reads, and the round-trip helper they share with the claim.

On PostgreSQL they run on the store's quick pool (autocommit, no pre-ping, one retry on a
dropped connection; see `database.open_quick_engine`) and read a run with its transcript in one
round trip; on SQLite they run on the store's one engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, select
from sqlalchemy.exc import DBAPIError

from orchestrator.errors import RunNotFoundError
from orchestrator.messages import Message
from orchestrator.run import RetryWait, RunOutput, RunRecord, Session
from orchestrator.status import RunStatus
from orchestrator.store import statements
from orchestrator.store.schema import events, runs, sessions, tool_starts

S = RunStatus
T = TypeVar("T")


class StoreReads:
    """Reads of runs, messages, sessions and events (a base of `Store`)."""

    quick_engine: Engine
    _is_pg: bool
    _autocommit: bool

    def _quick(self, work: Callable[[Connection], T]) -> T:
        """Run `work` on a connection of the quick pool (reads and the claim). On PostgreSQL that
        pool has no pre-ping: when the server dropped the connection (a restart, a failover, an
        idle timeout), the pool is refreshed and `work` runs once more on a new connection."""
        try:
            return self._quick_once(work)
        except DBAPIError as exc:
            if not (self._is_pg and exc.connection_invalidated):
                raise
        return self._quick_once(work)

    def _quick_once(self, work: Callable[[Connection], T]) -> T:
        with self.quick_engine.connect() as conn:
            result = work(conn)
            if self._is_pg and not self._autocommit:  # a pinned READ COMMITTED transaction
                conn.commit()
            return result

    def get_record(self, run_id: str, conn: Connection | None = None) -> RunRecord:
        """The run's row, or RunNotFoundError."""
        if conn is None:
            return self._quick(lambda c: self.get_record(run_id, c))
        row = conn.execute(statements.RUN, {"b_run_id": run_id}).first()
        if row is None:
            raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")
        return RunRecord.from_row(row)

    def get_messages(self, run_id: str, conn: Connection | None = None) -> list[Message]:
        """The run's stored messages in order (the system message lives on the run row)."""
        if conn is None:
            return self._quick(lambda c: self.get_messages(run_id, c))
        rows = conn.execute(statements.MESSAGES, {"b_run_id": run_id, "b_since": 0})
        return [Message.from_row(r) for r in rows]

    def get_output(self, run_id: str) -> RunOutput:
        """The run with its transcript and its member runs (recursively)."""
        if not self._is_pg:
            return self._quick(lambda conn: self._output(conn, self.get_record(run_id, conn)))

        def read(conn: Connection) -> RunOutput:
            # The run and its transcript in one round trip.
            row = conn.execute(statements.RUN_PG, {"b_run_id": run_id, "b_since": 0}).first()
            if row is None:
                raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")
            record = RunRecord.from_row(row)
            return self._output(conn, record, statements.messages_from_json(row.messages_json))

        return self._quick(read)

    def final_output(self, run_id: str) -> RunOutput | None:
        """The run's output once it stopped (`RunStatus.is_final`), else None: what a waiter polls.
        On SQLite one read, the row and the transcript from one snapshot; on PostgreSQL the row,
        then `get_output` once it stopped."""
        if self._is_pg:
            return self.get_output(run_id) if self.get_record(run_id).status.is_final else None

        def read(conn: Connection) -> RunOutput | None:
            record = self.get_record(run_id, conn)
            return self._output(conn, record) if record.status.is_final else None

        return self._quick(read)

    def _output(self, conn: Connection, record: RunRecord, transcript: list[Message] | None = None) -> RunOutput:
        members: list[RunOutput] = []
        if record.kind == "team":  # only a team's runs have member runs
            members = [self._output(conn, child) for child in self.children(record.run_id, conn)]
        if transcript is None:
            transcript = self.get_messages(record.run_id, conn)
        retry = self._retry_wait(conn, record) if record.status == S.QUEUED and record.retries else None
        return RunOutput.from_record(record, transcript, members, retry)

    def _retry_wait(self, conn: Connection, record: RunRecord) -> RetryWait | None:
        """Why a QUEUED run waits: the last retry its step recorded (one read, only for such runs)."""
        row = conn.execute(
            select(events.c.at, events.c.detail)
            .where(events.c.run_id == record.run_id, events.c.kind == "retry", events.c.seq == record.seq)
            .order_by(events.c.id.desc())
            .limit(1)
        ).first()
        if row is None:
            return None
        detail = json.loads(row.detail) if row.detail else {}
        error = detail.get("error") or {}
        reason = f"{error.get('type', 'Error')}: {error.get('message', '')}"
        return RetryWait(attempt=record.retries, until=row.at + float(detail.get("delay", 0.0)), reason=reason)

    def get_session(self, session_id: str) -> Session | None:
        """The session's top-level runs, oldest first; None if the session does not exist."""
        return self._quick(lambda conn: self._session(conn, session_id))

    def _session(self, conn: Connection, session_id: str) -> Session | None:
        if conn.execute(select(sessions.c.session_id).where(sessions.c.session_id == session_id)).first() is None:
            return None
        rows = conn.execute(
            select(runs)
            .where(runs.c.session_id == session_id, runs.c.parent_run_id.is_(None))
            .order_by(runs.c.created_at, runs.c.run_id)
        )
        return Session(session_id=session_id, runs=[self._output(conn, RunRecord.from_row(r)) for r in rows])

    def get_events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events (errors, retries, continues, sweeps), oldest first."""

        def read(conn: Connection) -> list[dict[str, Any]]:
            rows = conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.id))
            return [
                {"at": r.at, "kind": r.kind, "seq": r.seq, "detail": json.loads(r.detail) if r.detail else None}
                for r in rows
            ]

        return self._quick(read)

    def children(self, run_id: str, conn: Connection | None = None) -> list[RunRecord]:
        """The run's direct child runs, oldest first."""
        if conn is None:
            return self._quick(lambda c: self.children(run_id, c))
        query = select(runs).where(runs.c.parent_run_id == run_id).order_by(runs.c.created_at, runs.c.run_id)
        rows = conn.execute(query)
        return [RunRecord.from_row(r) for r in rows]

    def started_tool_calls(self, run_id: str) -> set[str]:
        """Ids of at-most-once calls that were started (finished or not)."""
        query = select(tool_starts.c.tool_call_id).where(tool_starts.c.run_id == run_id)
        return self._quick(lambda conn: {r.tool_call_id for r in conn.execute(query)})

    def due_runs(self, *, now: float, limit: int = 200) -> tuple[list[RunRecord], list[RunRecord]]:
        """Runs the sweeper must act on: (RUNNING with an expired lease, QUEUED and due to publish)."""

        def read(conn: Connection) -> tuple[list[RunRecord], list[RunRecord]]:
            expired = conn.execute(
                select(runs).where(runs.c.status == S.RUNNING.value, runs.c.lease_expires_at < now)
                .order_by(runs.c.lease_expires_at).limit(limit)
            )  # fmt: skip
            due = conn.execute(
                select(runs).where(runs.c.status == S.QUEUED.value, runs.c.publish_after <= now)
                .order_by(runs.c.publish_after).limit(limit)
            )  # fmt: skip
            return [RunRecord.from_row(r) for r in expired], [RunRecord.from_row(r) for r in due]

        return self._quick(read)
