"""The run store's reads: functions of a connection, the same on SQLite and PostgreSQL.

`Store` runs them on its backend's quick pool (`Backend.quick`), or on the caller's connection
where it passes one (the fan-in reads inside its transaction); on PostgreSQL `get_output` reads the
run with its transcript in one round trip instead (`PostgresBackend.output`), then `output_of`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Row, select

from orchestrator.errors import RunNotFoundError
from orchestrator.messages import Message
from orchestrator.requirements import RunRequirement
from orchestrator.run import LogEntry, RetryWait, RunOutput, RunPage, RunRecord, Session
from orchestrator.state import from_json
from orchestrator.status import RunStatus
from orchestrator.store import direct, listing, requirement_rows, sessions, statements
from orchestrator.store.tables import events, messages, runs, tool_starts
from orchestrator.usage import USAGE_COLUMNS

if TYPE_CHECKING:
    from orchestrator.store.backend import Backend

S = RunStatus
T = TypeVar("T")
#: The columns of `ratchet_messages` a run's steps are derived from (`StepRows`): where each
#: message is and who wrote it, not its content.
STAMPS = (
    "idx", "role", "seq", "epoch", "created_at", "step_started_at", "tool_calls", "tool_call_id", "tool_call_error",
    "model", "definition_hash", *USAGE_COLUMNS,
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class EventRows:
    """What a run's durable events are derived from (`orchestrator.events.derive`), read in one
    snapshot: its row, its message rows from an index on (idx order; each with `idx`, `seq`,
    `epoch` and the message's columns), its `ratchet_events` rows (id order), for a team its
    member runs, and for a run that paused what it asked (`paused_requirements`)."""

    record: RunRecord
    messages: Sequence[Any]
    logged: Sequence[Any]
    members: Sequence[RunRecord] = ()
    requirements: Sequence[RunRequirement] = ()


@dataclass(frozen=True, kw_only=True)
class StepRows:
    """What a run's steps are derived from (`orchestrator.timeline.derive_steps`), read in one
    snapshot: its row, its messages' `STAMPS` (idx order) and its log (oldest first)."""

    record: RunRecord
    messages: Sequence[Any]
    log: list[LogEntry]


def get_record(conn: Connection, run_id: str) -> RunRecord:
    """The run's row, or RunNotFoundError."""
    record = find_record(conn, run_id)
    if record is None:
        raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")
    return record


def find_record(conn: Connection, run_id: str) -> RunRecord | None:
    """The run's row, or None."""
    row = direct.first(conn, statements.RUN, {"b_run_id": run_id})
    return RunRecord.from_row(row) if row is not None else None


def statuses(conn: Connection, run_ids: Sequence[str]) -> dict[str, RunStatus]:
    """The status of each of these runs this database holds (a run it does not is left out)."""
    found: dict[str, RunStatus] = {}
    for i in range(0, len(run_ids), 500):  # within every database's limit of bound parameters
        rows = conn.execute(select(runs.c.run_id, runs.c.status).where(runs.c.run_id.in_(run_ids[i : i + 500])))
        found.update((row.run_id, RunStatus(row.status)) for row in rows)
    return found


def get_messages(conn: Connection, run_id: str) -> list[Message]:
    """The run's stored messages in order (the system message lives on the run row)."""
    rows = direct.rows(conn, statements.MESSAGES, {"b_run_id": run_id, "b_since": 0})
    return [Message.from_row(r) for r in rows]


def get_output(conn: Connection, run_id: str) -> RunOutput:
    """The run with its transcript and its member runs (recursively)."""
    return output_of(conn, get_record(conn, run_id))


def final_output(conn: Connection, run_id: str) -> RunOutput | None:
    """The run's output once it stopped (`RunStatus.is_final`), else None: what a waiter polls,
    reading the output in the poll that finds the run stopped."""
    record = get_record(conn, run_id)
    return output_of(conn, record) if record.status.is_final else None


def output_of(
    conn: Connection,
    record: RunRecord,
    transcript: list[Message] | None = None,
    state: dict[str, Any] | None = None,
) -> RunOutput:
    """The output of the run `record`; `transcript`: its messages, and `state`: its session's
    state, if the caller read them already."""
    if state is None:
        state = sessions.run_state(conn, record)
    members: list[RunOutput] = []
    if record.kind == "team":  # only a team's runs have member runs
        members = [output_of(conn, child, state=state) for child in children(conn, record.run_id)]
    if transcript is None:
        transcript = get_messages(conn, record.run_id)
    retry = _retry_wait(conn, record) if record.status == S.QUEUED and record.retries else None
    asked = requirement_rows.of_run(conn, record.run_id)
    if record.status != S.PAUSED:  # its run moved on without them (cancelled): nobody is asked any more
        asked = [replace(r, status="void") if r.status == "pending" else r for r in asked]
    for member in members:
        asked.extend(r.with_member(member.run_id, member.agent_name) for r in member.requirements)
    asked.sort(key=lambda r: r.created_at)
    return RunOutput.from_record(record, transcript, members, retry, session_state=state, requirements=asked)


def _retry_wait(conn: Connection, record: RunRecord) -> RetryWait | None:
    """Why a QUEUED run waits: the last retry its step recorded (one read, only for such runs)."""
    row = _retry_row(conn, record.run_id, record.seq)
    if row is None:
        return None
    detail = json.loads(row.detail) if row.detail else {}
    error = detail.get("error") or {}
    reason = f"{error.get('type', 'Error')}: {error.get('message', '')}"
    return RetryWait(attempt=record.retries, until=row.at + float(detail.get("delay", 0.0)), reason=reason)


def retry_detail(conn: Connection, run_id: str, seq: int) -> dict[str, Any]:
    """What the retry parked at step `seq` recorded (its error, its delay); {} if none did."""
    row = _retry_row(conn, run_id, seq)
    return json.loads(row.detail) if row is not None and row.detail else {}


def _retry_row(conn: Connection, run_id: str, seq: int) -> Row[Any, Any] | None:
    return conn.execute(
        select(events.c.at, events.c.detail)
        .where(events.c.run_id == run_id, events.c.kind == "retry", events.c.seq == seq)
        .order_by(events.c.id.desc())
        .limit(1)
    ).first()


def get_session(conn: Connection, session_id: str, user_id: str | None = None) -> Session | None:
    """The session, its state and its top-level runs, oldest first; None if the session does not
    exist. With `user_id`: only if it is that user's (a session is its first run's user's), with
    that user's runs only. Each run shows the state it sees (`sessions.run_state`): {} for a run
    of another user, which only a store written before sessions took one user holds."""
    found = sessions.row(conn, session_id)
    if found is None or (user_id is not None and found.user_id != user_id):
        return None
    query = select(runs).where(runs.c.session_id == session_id, runs.c.parent_run_id.is_(None))
    if user_id is not None:
        query = query.where(runs.c.user_id == user_id)
    state = from_json(found.session_state)
    outputs = [
        output_of(conn, record, state=state if record.user_id == found.user_id else {})
        for record in map(RunRecord.from_row, conn.execute(query.order_by(runs.c.created_at, runs.c.run_id)))
    ]
    return Session(session_id=session_id, runs=outputs, user_id=found.user_id, session_state=state)


def get_events(conn: Connection, run_id: str) -> list[dict[str, Any]]:
    """The run's events (errors, retries, continues, sweeps), oldest first."""
    rows = conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.id))
    return [
        {"at": r.at, "kind": r.kind, "seq": r.seq, "detail": json.loads(r.detail) if r.detail else None} for r in rows
    ]


def get_log(conn: Connection, run_id: str) -> list[LogEntry]:
    """The run's log (what `ratchet_events` holds for it), oldest first; RunNotFoundError if
    there is no such run."""
    get_record(conn, run_id)
    return _log_entries(conn, run_id)


def _log_entries(conn: Connection, run_id: str) -> list[LogEntry]:
    rows = conn.execute(select(events).where(events.c.run_id == run_id).order_by(events.c.id))
    return [
        LogEntry(
            id=r.id, run_id=r.run_id, at=r.at, kind=r.kind, seq=r.seq, detail=json.loads(r.detail) if r.detail else None
        )
        for r in rows
    ]


def step_rows(conn: Connection, run_id: str) -> StepRows:
    """The run's row, its messages' stamps and its log; RunNotFoundError if there is no such run."""
    record = get_record(conn, run_id)
    columns = [messages.c[name] for name in STAMPS]
    rows = conn.execute(select(*columns).where(messages.c.run_id == run_id).order_by(messages.c.idx)).all()
    return StepRows(record=record, messages=rows, log=_log_entries(conn, run_id))


def event_rows(conn: Connection, run_id: str, since: int) -> EventRows:
    """The run's row and the rows of its durable events, its messages from index `since` on.
    Read in one snapshot (`Backend.snapshot`): rows read by separate statements at READ
    COMMITTED could miss an event that a later statement's rows sort after."""
    record = get_record(conn, run_id)
    rows = direct.rows(conn, statements.MESSAGES, {"b_run_id": run_id, "b_since": since})
    logged = direct.rows(conn, statements.EVENTS, {"b_run_id": run_id})
    members = children(conn, run_id) if record.kind == "team" else []
    asked = paused_requirements(conn, record, logged)
    return EventRows(record=record, messages=rows, logged=logged, members=members, requirements=asked)


def paused_requirements(conn: Connection, record: RunRecord, logged: Sequence[Any]) -> list[RunRequirement]:
    """What the run asked a person, for its pause and decision events: its own requirements and,
    for a team, its member runs' at any depth (each naming its member run). Read only for a run
    whose log (`logged`, its `ratchet_events` rows) holds a pause: nothing for any other."""
    if not any(row.kind == "paused" for row in logged):
        return []
    return _tree_requirements(conn, record, depth=0)


def _tree_requirements(conn: Connection, record: RunRecord, depth: int) -> list[RunRequirement]:
    asked = requirement_rows.of_run(conn, record.run_id)
    if record.kind == "team" and depth < 64:
        for child in children(conn, record.run_id):
            below = _tree_requirements(conn, child, depth + 1)
            asked.extend(r.with_member(child.run_id, child.agent_name) for r in below)
    return asked


def children(conn: Connection, run_id: str) -> list[RunRecord]:
    """The run's direct child runs, oldest first."""
    query = select(runs).where(runs.c.parent_run_id == run_id).order_by(runs.c.created_at, runs.c.run_id)
    return [RunRecord.from_row(r) for r in conn.execute(query)]


def started_tool_calls(conn: Connection, run_id: str) -> set[str]:
    """Ids of at-most-once calls that were started (finished or not)."""
    query = select(tool_starts.c.tool_call_id).where(tool_starts.c.run_id == run_id)
    return {r.tool_call_id for r in conn.execute(query)}


def has_tool_result(conn: Connection, run_id: str, tool_call_id: str) -> bool:
    """Whether a result of this tool call is stored."""
    query = select(messages.c.idx).where(messages.c.run_id == run_id, messages.c.tool_call_id == tool_call_id)
    return conn.execute(query).first() is not None


def due_runs(conn: Connection, *, now: float, limit: int) -> tuple[list[RunRecord], list[RunRecord]]:
    """Runs the sweeper must act on: (RUNNING with an expired lease, QUEUED and due to publish)."""
    expired = conn.execute(
        select(runs)
        .where(runs.c.status == S.RUNNING.value, runs.c.lease_expires_at < now)
        .order_by(runs.c.lease_expires_at)
        .limit(limit)
    )
    due = conn.execute(
        select(runs)
        .where(runs.c.status == S.QUEUED.value, runs.c.publish_after <= now)
        .order_by(runs.c.publish_after)
        .limit(limit)
    )
    return [RunRecord.from_row(r) for r in expired], [RunRecord.from_row(r) for r in due]


class Reader:
    """The run store's reads, each a function above on its backend's quick pool (or in one
    snapshot), or on the caller's connection where the store's own transaction gives one.
    `Store` is a `Reader` that also writes."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def _read(self, conn: Connection | None, read: Callable[[Connection], T]) -> T:
        return read(conn) if conn is not None else self._backend.quick(read)

    def get_record(self, run_id: str, conn: Connection | None = None) -> RunRecord:
        """The run's row, or RunNotFoundError."""
        return self._read(conn, lambda c: get_record(c, run_id))

    def statuses(self, run_ids: Sequence[str]) -> dict[str, RunStatus]:
        """The status of each of these runs this database holds (a run it does not is left out)."""
        return self._backend.quick(lambda c: statuses(c, run_ids))

    def get_messages(self, run_id: str, conn: Connection | None = None) -> list[Message]:
        """The run's stored messages in order (the system message lives on the run row)."""
        return self._read(conn, lambda c: get_messages(c, run_id))

    def children(self, run_id: str, conn: Connection | None = None) -> list[RunRecord]:
        """The run's direct child runs, oldest first."""
        return self._read(conn, lambda c: children(c, run_id))

    def get_output(self, run_id: str) -> RunOutput:
        """The run with its transcript and its member runs (recursively)."""
        return self._backend.quick(lambda c: self._backend.output(c, run_id))

    def final_output(self, run_id: str) -> RunOutput | None:
        """The run's output if it stopped, else None, in one read: what a waiter polls."""
        return self._backend.quick(lambda c: final_output(c, run_id))

    def get_session(self, session_id: str, user_id: str | None = None) -> Session | None:
        """The session, its state and its top-level runs, oldest first; None if the session does
        not exist, or is not `user_id`'s when one is given (then only that user's runs)."""
        return self._backend.quick(lambda c: get_session(c, session_id, user_id))

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
        return self._backend.quick(lambda c: retry_detail(c, run_id, seq))

    def get_events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events (errors, retries, continues, sweeps), oldest first."""
        return self._backend.quick(lambda c: get_events(c, run_id))

    def get_log(self, run_id: str) -> list[LogEntry]:
        """The run's log (retries, errors, recoveries, fences, continues...), oldest first, read
        with the run in one snapshot; RunNotFoundError if there is no such run."""
        return self._backend.snapshot(lambda c: get_log(c, run_id))

    def step_rows(self, run_id: str) -> StepRows:
        """What the run's steps are derived from (`orchestrator.timeline`): its row, its messages'
        stamps and its log, read in one snapshot; RunNotFoundError if there is no such run."""
        return self._backend.snapshot(lambda c: step_rows(c, run_id))

    def list_runs(self, filter: listing.RunFilter, *, limit: int, cursor: str | None = None) -> RunPage:
        """One page of the runs `filter` selects, newest first, after `cursor` (`store/listing.py`)."""
        return self._backend.quick(lambda c: listing.list_runs(c, filter, limit=limit, cursor=cursor))

    def event_rows(self, run_id: str, since: int = 0) -> EventRows:
        """What the run's durable events are derived from (`orchestrator.events`): its row and
        the rows of its events, its messages from index `since` on, read in one snapshot."""
        return self._backend.event_rows(run_id, since)

    def started_tool_calls(self, run_id: str) -> set[str]:
        """Ids of at-most-once calls that were started (finished or not)."""
        return self._backend.quick(lambda c: started_tool_calls(c, run_id))

    def has_tool_result(self, run_id: str, tool_call_id: str) -> bool:
        """Whether a result of this tool call is stored (a retried append looks before writing)."""
        return self._backend.quick(lambda c: has_tool_result(c, run_id, tool_call_id))

    def due_runs(self, *, now: float, limit: int = 200) -> tuple[list[RunRecord], list[RunRecord]]:
        """Runs the sweeper must act on: (RUNNING with an expired lease, QUEUED and due to publish)."""
        return self._backend.quick(lambda c: due_runs(c, now=now, limit=limit))
