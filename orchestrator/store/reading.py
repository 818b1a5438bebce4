"""The store's reads (`Store` inherits them): each a function of `reads.py` on the quick pool,
or on the caller's connection when one is given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection

from orchestrator.events import Key, RunEvent
from orchestrator.messages import Message
from orchestrator.run import LogEntry, RunOutput, RunPage, RunRecord, Session
from orchestrator.status import RunStatus
from orchestrator.store import listing, reads, sessions
from orchestrator.store.backend import Backend
from orchestrator.timeline import Step

T = TypeVar("T")


class StoreReads:
    """The read half of `Store`: needs only its backend."""

    _backend: Backend

    def _read(self, conn: Connection | None, read: Callable[[Connection], T]) -> T:
        return read(conn) if conn is not None else self._backend.quick(read)

    def get_record(self, run_id: str, conn: Connection | None = None) -> RunRecord:
        """The run's row, or RunNotFoundError."""
        return self._read(conn, lambda c: reads.get_record(c, run_id))

    def statuses(self, run_ids: Sequence[str]) -> dict[str, RunStatus]:
        """The status of each of these runs this database holds (a run it does not is left out)."""
        return self._backend.quick(lambda c: reads.statuses(c, run_ids))

    def get_messages(self, run_id: str, conn: Connection | None = None) -> list[Message]:
        """The run's stored messages in order (the system message lives on the run row)."""
        return self._read(conn, lambda c: reads.get_messages(c, run_id))

    def children(self, run_id: str, conn: Connection | None = None) -> list[RunRecord]:
        """The run's direct child runs, oldest first."""
        return self._read(conn, lambda c: reads.children(c, run_id))

    def get_output(self, run_id: str) -> RunOutput:
        """The run with its transcript and its member runs (recursively)."""
        return self._backend.quick(lambda c: self._backend.output(c, run_id))

    def final_output(self, run_id: str) -> RunOutput | None:
        """The run's output if it stopped, else None, in one read: what a waiter polls."""
        return self._backend.quick(lambda c: reads.final_output(c, run_id))

    def get_session(self, session_id: str, user_id: str | None = None) -> Session | None:
        """The session, its state and its top-level runs, oldest first; None if the session does
        not exist, or is not `user_id`'s when one is given (then only that user's runs)."""
        return self._backend.quick(lambda c: reads.get_session(c, session_id, user_id))

    def session_state(self, session_id: str) -> dict[str, Any]:
        """The session's state as stored now ({} when none was set)."""
        return self._backend.quick(lambda c: sessions.read_state(c, session_id))

    def user_state(self, session_id: str, user_id: str) -> dict[str, Any]:
        """The session's state if the session is `user_id`'s, else {} (`sessions.user_state`)."""
        return self._backend.quick(lambda c: sessions.user_state(c, session_id, user_id))

    def run_state(self, run: RunRecord) -> dict[str, Any]:
        """The session state `run`'s tools see: its session's as stored now, or {} when the
        session is another user's (a run written before sessions took one user: `sessions`)."""
        return self._backend.quick(lambda c: sessions.run_state(c, run))

    def retry_detail(self, run_id: str, seq: int) -> dict[str, Any]:
        """What the retry parked at step `seq` recorded ({} if none): one indexed row."""
        return self._backend.quick(lambda c: reads.retry_detail(c, run_id, seq))

    def get_events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events (errors, retries, continues, sweeps), oldest first."""
        return self._backend.quick(lambda c: reads.get_events(c, run_id))

    def get_log(self, run_id: str) -> list[LogEntry]:
        """The run's log (retries, errors, recoveries, fences, continues...), oldest first, read
        with the run in one snapshot; RunNotFoundError if there is no such run."""
        return self._backend.snapshot(lambda c: reads.get_log(c, run_id))

    def get_steps(self, run_id: str) -> list[Step]:
        """The run's steps (`orchestrator.timeline`), read with the run and its log in one
        snapshot; RunNotFoundError if there is no such run."""
        return self._backend.snapshot(lambda c: reads.get_steps(c, run_id))

    def list_runs(self, filter: listing.RunFilter, *, limit: int, cursor: str | None = None) -> RunPage:
        """One page of the runs `filter` selects, newest first, after `cursor` (`store/listing.py`)."""
        return self._backend.quick(lambda c: listing.list_runs(c, filter, limit=limit, cursor=cursor))

    def run_events(self, run_id: str, after: Key | None = None) -> tuple[RunRecord, list[RunEvent]]:
        """The run's row and its durable events after `after` in id order, read in one snapshot."""
        return self._backend.run_events(run_id, after)

    def started_tool_calls(self, run_id: str) -> set[str]:
        """Ids of at-most-once calls that were started (finished or not)."""
        return self._backend.quick(lambda c: reads.started_tool_calls(c, run_id))

    def has_tool_result(self, run_id: str, tool_call_id: str) -> bool:
        """Whether a result of this tool call is stored (a retried append looks before writing)."""
        return self._backend.quick(lambda c: reads.has_tool_result(c, run_id, tool_call_id))

    def due_runs(self, *, now: float, limit: int = 200) -> tuple[list[RunRecord], list[RunRecord]]:
        """Runs the sweeper must act on: (RUNNING with an expired lease, QUEUED and due to publish)."""
        return self._backend.quick(lambda c: reads.due_runs(c, now=now, limit=limit))
