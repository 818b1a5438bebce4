"""The run store's reads: functions of a connection, the same on SQLite and PostgreSQL.

`Store` runs them on its backend's quick pool (`Backend.quick`), or on the caller's connection
where it passes one (the fan-in reads inside its transaction); on PostgreSQL `get_output` reads the
run with its transcript in one round trip instead (`PostgresBackend.output`), then `output_of`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, select

from orchestrator.errors import RunNotFoundError
from orchestrator.events import Key, RunEvent, derive
from orchestrator.messages import Message
from orchestrator.run import LogEntry, RetryWait, RunOutput, RunRecord, Session
from orchestrator.state import from_json
from orchestrator.status import RunStatus
from orchestrator.store import direct, sessions, statements
from orchestrator.store.tables import events, messages, runs, tool_starts
from orchestrator.timeline import COLUMNS, Step, derive_steps

S = RunStatus


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
    return RunOutput.from_record(record, transcript, members, retry, session_state=state)


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


def get_steps(conn: Connection, run_id: str) -> list[Step]:
    """The run's steps in order (`orchestrator.timeline`), from its row, its messages' stamps
    (not their content) and its log; RunNotFoundError if there is no such run."""
    record = get_record(conn, run_id)
    columns = [messages.c[name] for name in COLUMNS]
    rows = conn.execute(select(*columns).where(messages.c.run_id == run_id).order_by(messages.c.idx)).all()
    return derive_steps(record, rows, _log_entries(conn, run_id))


def run_events(conn: Connection, run_id: str, after: Key | None = None) -> tuple[RunRecord, list[RunEvent]]:
    """The run's row and its durable events after `after`, in id order (`events.derive`). Read in
    one snapshot (`Backend.snapshot`): rows read by separate statements at READ COMMITTED could
    miss an event that a later statement's rows sort after."""
    record = get_record(conn, run_id)
    rows = direct.rows(conn, statements.MESSAGES, {"b_run_id": run_id, "b_since": events_since(after)})
    logged = direct.rows(conn, statements.EVENTS, {"b_run_id": run_id})
    members = children(conn, run_id) if record.kind == "team" else []
    return record, derive(record, rows, logged, members, after=after)


def events_since(after: Key | None) -> int:
    """The first message index whose events can come after `after` (rows below cannot yield a
    later key)."""
    return max(after[0] - 1, 0) if after is not None else 0


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
        select(runs).where(runs.c.status == S.RUNNING.value, runs.c.lease_expires_at < now)
        .order_by(runs.c.lease_expires_at).limit(limit)
    )  # fmt: skip
    due = conn.execute(
        select(runs).where(runs.c.status == S.QUEUED.value, runs.c.publish_after <= now)
        .order_by(runs.c.publish_after).limit(limit)
    )  # fmt: skip
    return [RunRecord.from_row(r) for r in expired], [RunRecord.from_row(r) for r in due]
