"""The statements every step runs, built once: the claim, the commit's move, a new run, and the
reads of a run and its transcript (which a waiter on SQLite polls).

Building a SQLAlchemy statement costs more than running it on SQLite (a fifth of a worker's
CPU per step in our profiles), so the per-step hot path uses these prebuilt statements with
bound parameters. They encode exactly the guarded moves `writes.move` would build, and take the
status they write from `status.transition` like every other write: the claim's move is checked
here, once, at import (even under `python -O`); the commit's status is a bound value, checked by
`Store.commit_step` on each call.

On PostgreSQL the commit is one statement (`COMMIT_PG`): the guarded move, the append of the
step's messages and, for a final move, the NOTIFY that wakes waiting producers, so it needs
no BEGIN, no second INSERT and no COMMIT round trip. The messages only go in if the move
matched: a fenced commit writes nothing.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    Boolean,
    Float,
    Integer,
    Select,
    String,
    Text,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by

from orchestrator.messages import Message
from orchestrator.status import RunStatus, transition
from orchestrator.store.notify import CHANNEL
from orchestrator.store.tables import events, messages, runs, sessions
from orchestrator.store.webhook_rows import stopped_pg
from orchestrator.usage import TIMING_COLUMNS, USAGE_COLUMNS

S = RunStatus

#: Take the run for step (seq, kind): QUEUED, or RUNNING with an expired lease, and not past its
#: deadline (no step starts after it: the sweeper stops the run); bump the epoch.
CLAIM = (
    update(runs)
    .where(
        runs.c.run_id == bindparam("b_run_id", type_=String),
        or_(
            runs.c.status == S.QUEUED.value,
            and_(runs.c.status == S.RUNNING.value, runs.c.lease_expires_at < bindparam("b_now", type_=Float)),
        ),
        runs.c.seq == bindparam("b_seq", type_=Integer),
        runs.c.next_step == bindparam("b_kind", type_=String),
        runs.c.attempts < bindparam("b_cap", type_=Integer),
        or_(runs.c.deadline_at.is_(None), runs.c.deadline_at > bindparam("b_now", type_=Float)),
    )
    .values(
        status=transition((S.QUEUED, S.RUNNING), S.RUNNING),
        updated_at=bindparam("b_now", type_=Float),
        epoch=runs.c.epoch + 1,
        lease_owner=bindparam("b_owner", type_=String),
        lease_expires_at=bindparam("b_expires", type_=Float),
        attempts=runs.c.attempts + 1,
        # The time of the move to QUEUED, before the claim overwrites it (SET reads the row as
        # it was): the step's queue wait starts there (metrics). Not known for a re-claim.
        queued_at=case((runs.c.status == S.QUEUED.value, runs.c.updated_at), else_=null()),
    )
    .returning(*runs.c)
)

#: Move a RUNNING run on at the holder's epoch while its lease is live: next seq, messages
#: counted, lease released. `content` and `system_message` are kept when the bound value is NULL
#: (a system message already stored always wins).
COMMIT = (
    update(runs)
    .where(
        runs.c.run_id == bindparam("b_run_id", type_=String),
        runs.c.status == S.RUNNING.value,
        runs.c.epoch == bindparam("b_epoch", type_=Integer),
        runs.c.lease_owner == bindparam("b_owner", type_=String),
        runs.c.lease_expires_at > bindparam("b_now", type_=Float),
    )
    .values(
        status=bindparam("b_status", type_=String),
        updated_at=bindparam("b_now", type_=Float),
        seq=runs.c.seq + 1,
        next_step=bindparam("b_next", type_=String),
        n_messages=runs.c.n_messages + bindparam("b_count", type_=Integer),
        attempts=0,
        retries=0,
        model_index=None,
        lease_owner=None,
        lease_expires_at=None,
        publish_after=bindparam("b_publish_after", type_=Float),
        content=func.coalesce(bindparam("b_content", type_=Text), runs.c.content),
        system_message=func.coalesce(runs.c.system_message, bindparam("b_system", type_=Text)),
    )
    .returning(*runs.c)
)


#: The run `b_run_id` (the waiter polls it every millisecond on SQLite).
RUN = select(runs).where(runs.c.run_id == bindparam("b_run_id", type_=String))
#: The messages of the run `b_run_id` from index `b_since` on, in order (a claim's transcript, reads).
MESSAGES = (
    select(messages)
    .where(
        messages.c.run_id == bindparam("b_run_id", type_=String),
        messages.c.idx >= bindparam("b_since", type_=Integer),
    )
    .order_by(messages.c.idx)
)
#: The log of the run `b_run_id` (its `ratchet_events` rows), oldest first.
EVENTS = select(events).where(events.c.run_id == bindparam("b_run_id", type_=String)).order_by(events.c.id)
#: The state of the session `b_session_id` (its JSON text; no row if there is no such session).
SESSION_STATE = select(sessions.c.session_state).where(sessions.c.session_id == bindparam("b_session_id", type_=String))
#: The same, only if the session is `b_user_id`'s (None included): the state a run of that user sees.
RUN_STATE = SESSION_STATE.where(sessions.c.user_id.is_not_distinct_from(bindparam("b_user_id", type_=String)))
#: Messages appended (`writes.insert_messages`); bind every column of `ratchet_messages` by name.
INSERT_MESSAGES = insert(messages)
#: SQLite: a new run; bind every column of `ratchet_runs` by name.
CREATE_RUN = insert(runs).returning(*runs.c)
#: SQLite: a run's session, unless it exists; bind `session_id`, `created_at` and `user_id`.
CREATE_SESSION = (
    sqlite.insert(sessions)
    .values({c: bindparam(c, type_=sessions.c[c].type) for c in ("session_id", "created_at", "user_id")})
    .on_conflict_do_nothing()
)
#: SQLite: the user of the session `b_session_id` (no row if there is no such session).
SESSION_OWNER = select(sessions.c.user_id).where(sessions.c.session_id == bindparam("b_session_id", type_=String))


#: A message's own columns (what a step writes), before its usage.
_MESSAGE_FIELDS = (
    "role", "content", "tool_calls", "tool_call_id", "tool_name", "tool_args", "tool_call_error", "model",
)  # fmt: skip
#: The message columns a write appends, in the order `message_arrays` gives them.
_APPENDED = (*_MESSAGE_FIELDS, *USAGE_COLUMNS, *TIMING_COLUMNS)
_ARRAY_TYPES = (
    String, Text, Text, String, String, Text, Boolean, String,  # _MESSAGE_FIELDS
    Integer, Integer, Integer, Integer, Integer, Float,  # USAGE_COLUMNS
    Float, Float,  # TIMING_COLUMNS
)  # fmt: skip


#: The columns a write stamps its messages with, in the order `_append_messages` selects them.
_STAMPS = ("created_at", "seq", "epoch", "step_started_at", "step_queued_at", "definition_hash")


def _append_messages(
    source: CTE,
    first_idx: Any,
    *,
    seq: Any,
    epoch: Any,
    started: Any = None,
    queued: Any = None,
    definition: Any = None,
) -> CTE:
    """PostgreSQL: INSERT the bound `message_arrays` as messages of the run `source` returns, at
    `first_idx` onwards, written by step `seq` at `epoch` (`started` and `queued`: the claim time
    of the step whose commit this is, and when it was queued; `definition`: its worker's
    definition hash); nothing when `source` returns no row (a guard that did not match)."""
    rows = (
        func.unnest(*(bindparam(f"b_m_{c}", type_=ARRAY(t)) for c, t in zip(_APPENDED, _ARRAY_TYPES, strict=True)))
        .table_valued(*_APPENDED, with_ordinality="ord")
        .render_derived(name="m")
    )
    return (
        insert(messages)
        .from_select(
            ["run_id", "idx", *_APPENDED, *_STAMPS],
            select(
                source.c.run_id,
                first_idx + rows.c.ord - 1,
                *(rows.c[c] for c in _APPENDED),
                bindparam("b_now", type_=Float),
                seq,
                epoch,
                started if started is not None else null(),
                queued if queued is not None else null(),
                definition if definition is not None else null(),
            )
            .select_from(source)
            .join(rows, true()),
        )
        .cte(f"{source.name}_messages")
    )


def _commit_pg(notify: bool, completed: bool = False) -> Select[Any]:
    moved = COMMIT.cte("moved")
    columns: list[Any] = [moved]
    if notify:
        columns.append(func.pg_notify(CHANNEL, moved.c.run_id).label("notified"))
    ctes: list[CTE] = []
    if completed:  # the run's "completed" event, in the same statement (metrics count it)
        ctes.append(insert(events).from_select(["run_id", "at", "kind", "seq"], _completed(moved)).cte("logged"))
    first = moved.c.n_messages - bindparam("b_count", type_=Integer)
    # Written by the claimed step: its seq (the move advances the run's) at the claim's epoch.
    appended = _append_messages(
        moved,
        first,
        seq=bindparam("b_step", type_=Integer),
        epoch=bindparam("b_epoch", type_=Integer),
        started=bindparam("b_started", type_=Float),
        queued=bindparam("b_queued", type_=Float),
        definition=bindparam("b_definition", type_=String),
    )
    if notify:  # a stop: the delivery its webhook is owed, in the same statement (nothing without one)
        ctes.append(stopped_pg(moved))
    return select(*columns).add_cte(appended, *ctes)


def _completed(source: Any) -> Select[Any]:
    """The "completed" event of the run `source` returns, at `b_now`, for step `b_step`."""
    return select(
        source.c.run_id,
        bindparam("b_now", type_=Float),
        literal_column("'completed'", String),
        bindparam("b_step", type_=Integer),
    ).select_from(source)


#: PostgreSQL: COMMIT and the INSERT of the step's messages in one statement; bind `COMMIT`'s
#: parameters, `b_step` (the claimed step's seq), `b_started` (its claim's time), `b_queued` (when
#: the step was queued), `b_definition` (its worker's definition hash) and
#: `message_arrays(new_messages)`. Zero rows: fenced, nothing written.
COMMIT_PG = _commit_pg(notify=False)
#: The same for a move to a final status, which also wakes the run's waiters when it commits and
#: writes the delivery its webhook is owed (`webhook_rows`).
COMMIT_PG_FINAL = _commit_pg(notify=True)
#: The same for a move to COMPLETED, which also logs the run's "completed" event (one statement still).
COMMIT_PG_COMPLETED = _commit_pg(notify=True, completed=True)
#: SQLite: the "completed" event, in the commit's transaction; bind `b_run_id`, `b_now`, `b_step`.
LOG_COMPLETED = insert(events).values(
    run_id=bindparam("b_run_id", type_=String),
    at=bindparam("b_now", type_=Float),
    kind="completed",
    seq=bindparam("b_step", type_=Integer),
)


def _create_pg() -> Select[Any]:
    new = postgresql.insert(sessions).values(
        session_id=bindparam("b_session_id", type_=String),
        created_at=bindparam("b_now", type_=Float),
        user_id=bindparam("b_user_id", type_=String),
    )
    # The session, new or its run's user's: an existing one is locked and compared as it is now
    # (ON CONFLICT DO UPDATE reads the latest committed row, waiting for one being written), so of
    # two first runs of a session racing, the second sees the first's user. The update writes the
    # value the row has (user_id is no key: it takes no lock a foreign key check waits for).
    session = (
        new.on_conflict_do_update(
            index_elements=[sessions.c.session_id],
            set_={"user_id": new.excluded.user_id},
            where=sessions.c.user_id.is_not_distinct_from(new.excluded.user_id),
        )
        .returning(sessions.c.session_id)
        .cte("joined_session")
    )
    columns = [c.name for c in runs.c]
    values = select(*(bindparam(f"b_r_{c.name}", type_=c.type) for c in runs.c)).select_from(session)
    run = insert(runs).from_select(columns, values).returning(*runs.c).cte("new_run")
    return select(run).add_cte(session, _append_messages(run, 0, seq=run.c.seq, epoch=run.c.epoch))


#: PostgreSQL: a new run, its session if new, and its input messages in one statement; bind
#: `b_session_id`, `b_now`, `b_user_id`, every run column as `b_r_<column>`, and
#: `message_arrays(input)`. No row, and nothing written, when the session belongs to another user.
CREATE_PG = _create_pg()


#: PostgreSQL: a lock on the name `b_name` that the transaction holds to its end (an advisory lock
#: on its 64-bit hash: `Backend.lock_names`).
LOCK_NAME = select(func.pg_advisory_xact_lock(func.hashtextextended(bindparam("b_name", type_=Text), 0)))


#: The message columns `with_messages` returns for each message, in this order.
MESSAGE_COLUMNS = (*_MESSAGE_FIELDS, "created_at", *USAGE_COLUMNS, *TIMING_COLUMNS)
_MessageRow = namedtuple("_MessageRow", MESSAGE_COLUMNS)  # type: ignore[misc]
#: The message columns `RUN_EVENTS_PG` returns for each message, in this order.
EVENT_MESSAGE_COLUMNS = ("idx", "seq", "epoch", *MESSAGE_COLUMNS)
_EventMessageRow = namedtuple("_EventMessageRow", EVENT_MESSAGE_COLUMNS)  # type: ignore[misc]


def with_messages(source: Any, columns: Sequence[str] = MESSAGE_COLUMNS) -> Select[Any]:
    """PostgreSQL: `source`'s run rows, each with its messages from index `b_since` on (up to the
    row's count) as one JSON array in the column `messages_json` (`columns` of each, in order):
    the run and its transcript in one round trip, from one snapshot."""
    m = messages.alias("m")
    where = and_(
        m.c.run_id == source.c.run_id, m.c.idx >= bindparam("b_since", type_=Integer), m.c.idx < source.c.n_messages
    )
    return select(source, _json_rows(m, columns, where, m.c.idx).label("messages_json"))


def _json_rows(table: Any, columns: Sequence[str], where: Any, order: Any) -> Any:
    """PostgreSQL: `columns` of `table`'s rows matching `where`, as one JSON array of arrays."""
    rows = select(func.json_agg(aggregate_order_by(func.json_build_array(*(table.c[c] for c in columns)), order)))
    return rows.where(where).scalar_subquery()


def asynchronous_commit() -> Any:
    """PostgreSQL: a column that makes the statement's own transaction commit without waiting for
    its WAL flush (a lazy write, autocommitted); no session setting outlives it."""
    return func.set_config("synchronous_commit", "off", true()).label("asynchronous_commit")


def _claim_pg() -> Select[Any]:
    claimed = CLAIM.cte("claimed")
    # Evaluated for the claimed row, inside the statement's own transaction.
    return with_messages(claimed).add_columns(asynchronous_commit())


#: PostgreSQL, autocommitted: CLAIM, returning the claimed row with the messages from `b_since`
#: on; the claim does not wait for its WAL flush (see `PostgresBackend.lazy`).
CLAIM_PG = _claim_pg()
#: PostgreSQL: the run `b_run_id` with its messages from `b_since` on, and its session's state
#: (`session_state_json`; NULL if the session is another user's: `sessions.run_state`): a
#: producer's read of a run in one round trip.
RUN_PG = (
    with_messages(runs)
    .add_columns(
        select(sessions.c.session_state)
        .where(sessions.c.session_id == runs.c.session_id, sessions.c.user_id.is_not_distinct_from(runs.c.user_id))
        .scalar_subquery()
        .label("session_state_json")
    )
    .where(runs.c.run_id == bindparam("b_run_id", type_=String))
)


_LoggedRow = namedtuple("_LoggedRow", [c.name for c in events.c])  # type: ignore[misc]


def _run_events_pg() -> Select[Any]:
    e = events.alias("e")
    logged = _json_rows(e, [c.name for c in events.c], e.c.run_id == runs.c.run_id, e.c.id)
    return (
        with_messages(runs, EVENT_MESSAGE_COLUMNS)
        .add_columns(logged.label("events_json"))
        .where(runs.c.run_id == bindparam("b_run_id", type_=String))
    )


#: PostgreSQL: the run `b_run_id` with its messages from `b_since` on (`messages_json`) and its
#: `ratchet_events` rows (`events_json`): what a reader's poll derives the durable events from, in
#: one round trip and one snapshot (a single statement), where a transaction of three reads costs five.
RUN_EVENTS_PG = _run_events_pg()


def event_rows(values: list[list[Any]] | None) -> list[Any]:
    """`RUN_EVENTS_PG`'s `messages_json` as rows of `ratchet_messages` (`EVENT_MESSAGE_COLUMNS`)."""
    return [_EventMessageRow(*v) for v in values or ()]


def logged_rows(values: list[list[Any]] | None) -> list[Any]:
    """`RUN_EVENTS_PG`'s `events_json` as rows of `ratchet_events`."""
    return [_LoggedRow(*v) for v in values or ()]


def messages_from_json(values: list[list[Any]] | None) -> list[Message]:
    """The messages of a `messages_json` column."""
    return [Message.from_row(_MessageRow(*v)) for v in values or ()]


def message_arrays(items: Sequence[Message]) -> dict[str, list[Any]]:
    """Messages as one array per column: the bound values of `COMMIT_PG` and `CREATE_PG`."""
    rows = [m.to_row() for m in items]
    return {f"b_m_{c}": [r[c] for r in rows] for c in _APPENDED}
