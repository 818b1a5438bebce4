"""Session history: which earlier runs of its session a run's context includes, and their messages.

A run of an agent with `add_history_to_context=True` has its history fixed at its first model
step, right after the claim: the last `num_history_runs` runs of the same session, agent and user
(None included), at the same level (top-level runs for a top-level run, member runs for a
member), created before it and COMPLETED at that moment, each with its message count then. Runs
in ERROR or CANCELLED are skipped, as Agno skips them, and so are runs still going (QUEUED,
RUNNING, WAITING, PAUSED): Agno reads a crashed RUNNING run's half-written transcript; Ratchet
never does, so two runs of one session started together never see each other's partial messages.

The choice is stored on the run (`ratchet_runs.history`, JSON `[[run_id, n_messages], ...]`,
oldest first) with a write fenced by the claim, so every later attempt of the run (a retry, a
recovery after a crash, a continue) reads the same list and the same prefixes of those runs'
messages, even if the session moved on in between. The history runs' messages are immutable
rows, so a worker keeps them in memory by that JSON: only a run's first step reads them.

A run of a serialized session (`serialize_session_runs`, `store/turns.py`) chooses when its turn
came, and every run it waited for has stopped: its history is the last runs COMPLETED then, created
before that moment, which holds a run started after it by its producer's clock that went first.

History never crosses users. A session takes runs only for its first run's user
(`Backend.create`), and the choice filters by the run's user besides. A store written before that
rule can hold one session with runs of several users, and histories chosen across them: a stored
history's runs of another user than the run's are left out of its prompt (each run's messages are
kept with its user), so such a run neither reads nor is read by another user's runs.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    String,
    Text,
    any_,
    bindparam,
    cast,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, aggregate_order_by

from orchestrator.errors import FencedError
from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import direct, statements
from orchestrator.store.backend import Backend
from orchestrator.store.claims import Claim, held
from orchestrator.store.tables import messages, runs

#: How many history runs' messages a worker keeps in memory (a run's share is a few messages).
CACHED_RUNS = 4096


def _chosen_statement(top_level: bool) -> Any:
    # The level as an expression no index serves, so that the planner walks the session's runs
    # (ix_ratchet_runs_session) and never the parent index, under which every top-level run of the
    # store sits: it chose that one on a freshly filled table (no statistics yet), a millisecond
    # a run for a hundred runs, and it would grow with the table.
    parent = func.coalesce(runs.c.parent_run_id, "")
    level = parent == "" if top_level else parent != ""
    return (
        select(runs.c.run_id, runs.c.n_messages, runs.c.created_at)
        .where(
            runs.c.session_id == bindparam("b_session_id", type_=String),
            runs.c.agent_name == bindparam("b_agent", type_=String),
            runs.c.user_id.is_not_distinct_from(bindparam("b_user_id", type_=String)),
            runs.c.status == RunStatus.COMPLETED.value,
            runs.c.run_id != bindparam("b_run_id", type_=String),
            runs.c.created_at <= bindparam("b_created", type_=Float),
            level,
        )
        .order_by(runs.c.created_at.desc(), runs.c.run_id.desc())
        .limit(bindparam("b_limit", type_=Integer))
    )


#: The candidates, for a top-level run and for a member run (prebuilt: built once, compiled once).
CHOSEN = {True: _chosen_statement(True), False: _chosen_statement(False)}


def _fix_pg_statement(top_level: bool) -> Any:
    # The choice and its fenced store in one statement, one round trip: the chosen runs as JSON
    # [[run_id, n_messages], ...], oldest first (`[]` for none), set where the claim still holds.
    chosen = CHOSEN[top_level].subquery()
    pair = func.json_build_array(chosen.c.run_id, chosen.c.n_messages)
    listed = func.json_agg(aggregate_order_by(pair, chosen.c.created_at, chosen.c.run_id))
    value = select(cast(func.coalesce(listed, literal_column("'[]'::json")), Text)).scalar_subquery()
    return (
        update(runs)
        .where(
            runs.c.run_id == bindparam("b_run_id", type_=String),
            runs.c.epoch == bindparam("b_epoch", type_=Integer),
            runs.c.lease_expires_at > bindparam("b_now", type_=Float),
            runs.c.lease_owner == bindparam("b_owner", type_=String),
            runs.c.history.is_(None),
        )
        .values(history=value)
        .returning(runs.c.history, statements.asynchronous_commit())  # a lazy write, as the claim is
    )


#: PostgreSQL: choose and store a claimed run's history (`fix`), by level as `CHOSEN`.
FIX_PG = {True: _fix_pg_statement(True), False: _fix_pg_statement(False)}


def _messages_of(runs_given: Any) -> Any:
    # Each message with its run's user (`run_user_id`): what keeps a history within one user.
    return (
        select(messages, runs.c.user_id.label("run_user_id"))
        .join(runs, runs.c.run_id == messages.c.run_id)
        .where(runs_given, messages.c.role != "system")
        .order_by(messages.c.run_id, messages.c.idx)
    )


#: The messages of some runs, without system messages, with their run's user; bind `b_run_ids` (a list).
MESSAGES_OF = _messages_of(messages.c.run_id.in_(bindparam("b_run_ids", expanding=True)))
#: PostgreSQL: the same, the runs bound as one array (`b_run_ids`), so the statement is compiled
#: once and runs on the driver (`direct`) whatever the number of runs.
MESSAGES_OF_PG = _messages_of(messages.c.run_id == any_(bindparam("b_run_ids", type_=ARRAY(String))))


class Part(NamedTuple):
    """One history run's messages (up to its count then), and whose run it is."""

    user_id: str | None
    messages: list[Message]


def choose(conn: Connection, record: RunRecord, num_runs: int, created_by: float | None = None) -> str:
    """The history of `record` as JSON: its session's last `num_runs` runs that qualify (above),
    created by `created_by` (None: by the run's own start)."""
    params = dict(
        b_session_id=record.session_id,
        b_agent=record.agent_name,
        b_user_id=record.user_id,
        b_run_id=record.run_id,
        b_created=record.created_at if created_by is None else created_by,
        b_limit=num_runs,
    )
    rows = conn.execute(CHOSEN[record.parent_run_id is None], params).all()
    return json.dumps([[r.run_id, r.n_messages] for r in reversed(rows)])


def fix(
    conn: Connection, claim: Claim, num_runs: int, now: float, *, arrays: bool, created_by: float | None = None
) -> str:
    """Choose the claimed run's history and store it, fenced by the claim (epoch, owner, live
    lease): the stored history, or FencedError if the claim was lost. `arrays`: the database
    binds a list as one array (`Backend.binds_arrays`), so one statement does it all;
    `created_by`: as `choose` takes it."""
    if arrays:
        record = claim.record
        params = dict(
            b_session_id=record.session_id,
            b_agent=record.agent_name,
            b_user_id=record.user_id,
            b_run_id=record.run_id,
            b_created=record.created_at if created_by is None else created_by,
            b_limit=num_runs,
            b_epoch=record.epoch,
            b_now=now,
            b_owner=record.lease_owner,
        )
        row = direct.first(conn, FIX_PG[record.parent_run_id is None], params)
        if row is None:
            raise FencedError(
                f"run {claim.run_id}: the claim of epoch {claim.epoch} was lost before its history was fixed"
            )
        return str(row.history)
    chosen = choose(conn, claim.record, num_runs, created_by)
    statement = (
        update(runs)
        .where(
            runs.c.run_id == claim.run_id,
            runs.c.epoch == claim.epoch,
            held(claim, now),
            runs.c.history.is_(None),
        )
        .values(history=chosen)
    )
    stored = conn.execute(statement.returning(runs.c.history)).scalar()
    if stored is None:
        raise FencedError(f"run {claim.run_id}: the claim of epoch {claim.epoch} was lost before its history was fixed")
    return str(stored)


def parse(history: str) -> list[tuple[str, int]]:
    """A stored history: (run_id, message count) of each run, oldest first."""
    return [(str(run_id), int(count)) for run_id, count in json.loads(history)]


def _read(conn: Connection, chosen: Sequence[tuple[str, int]], *, arrays: bool) -> dict[tuple[str, int], Part]:
    """The messages of each chosen run, up to its count then, without system messages."""
    if not chosen:
        return {}
    limits = dict(chosen)
    found: dict[tuple[str, int], list[Message]] = {key: [] for key in chosen}
    users: dict[tuple[str, int], str | None] = {}
    if arrays:
        rows = direct.rows(conn, MESSAGES_OF_PG, {"b_run_ids": list(limits)})
    else:
        rows = list(conn.execute(MESSAGES_OF, {"b_run_ids": list(limits)}))
    for row in rows:
        if row.idx < limits[row.run_id]:
            key = (row.run_id, limits[row.run_id])
            found[key].append(Message.from_row(row))
            users[key] = row.run_user_id
    # A run without messages is nobody's: it adds nothing to any prompt.
    return {key: Part(users.get(key), items) for key, items in found.items()}


class HistoryCache:
    """A worker's memory of history runs' messages and users, by (run_id, count): committed rows
    never change, so an entry stays true; least recently used runs go first."""

    def __init__(self, size: int = CACHED_RUNS) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, int], Part] = OrderedDict()
        self._lock = threading.Lock()

    def missing(self, chosen: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        with self._lock:
            return [key for key in chosen if key not in self._items]

    def put(self, found: dict[tuple[str, int], Part]) -> None:
        with self._lock:
            for key, items in found.items():
                self._items[key] = items
                self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def messages(
        self, chosen: Sequence[tuple[str, int]], user_id: str | None, read: dict[tuple[str, int], Part] | None = None
    ) -> list[Message] | None:
        """The messages of the chosen runs of `user_id` in order (from `read` where it has
        them, else kept), or None if one of the chosen runs is in neither."""
        read = read or {}
        with self._lock:
            parts = [read.get(key, self._items.get(key)) for key in chosen]
            for key in chosen:
                if key in self._items:
                    self._items.move_to_end(key)
        if any(p is None for p in parts):
            return None
        return [m for part in parts if part is not None and part.user_id == user_id for m in part.messages]


def for_claim(
    backend: Backend, cache: HistoryCache, claim: Claim, num_runs: int, now: float, in_turn: bool = False
) -> list[Message]:
    """`Store.history`: fix the claimed run's history if it has none yet (reading the chosen runs'
    messages in the same lazy transaction), else read what is stored; messages a worker read
    before come from `cache`. Only the chosen runs of the claimed run's user count. `in_turn`:
    a serialized session's run, whose history is every run that completed before its turn,
    created before `now` (above)."""
    read: dict[tuple[str, int], Part] = {}
    if claim.record.history is None:
        created_by = now if in_turn else None

        def fix_and_read(c: Connection) -> list[tuple[str, int]]:
            chosen = parse(fix(c, claim, num_runs, now, arrays=backend.binds_arrays, created_by=created_by))
            read.update(_read(c, cache.missing(chosen), arrays=backend.binds_arrays))  # same transaction
            return chosen

        chosen = backend.lazy(fix_and_read)
    else:
        chosen = parse(claim.record.history)
    user = claim.record.user_id
    found = cache.messages(chosen, user, read)
    if found is None:
        missing = cache.missing(chosen)
        read = backend.quick(lambda c: _read(c, missing, arrays=backend.binds_arrays))
        found = cache.messages(chosen, user, read)
    cache.put(read)
    assert found is not None  # every chosen run is kept or was just read
    return found
