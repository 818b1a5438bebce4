"""A person's decision stored at once: the common case of `Requirements.decide` in prebuilt
statements, on PostgreSQL in one round trip.

The common case is a confirm, a reject or an external result (`requirements.answered_by`) on a
pending requirement of a PAUSED run outside a team, before its deadline and the run's
(`run_timeout`), not at the deadline's own hand, and, for a decision a producer checks against
the catalog (a confirm or a result: `requirements.needs_the_tool`), of an agent no definition of
which is live but the one whose worker paused the call (the catalog tells of no deploy since). There the decision is one
guarded write: the requirement decided, its "decision" event logged, and, when it was the run's
last pending requirement, the run moved PAUSED -> QUEUED (epoch bumped, outbox marker set) with
its "resume" event, exactly the rows the general path writes. Every other case (a member's
requirement, a requirement decided or expired already, an unknown id, a run that is not PAUSED,
a decision of the wrong kind, input and budget raises, another definition live) matches nothing
and writes nothing here, and `Requirements.decide` takes the general path, which reads
everything under the tree's locks and gives the exact answer or error (a decision on a tool that
a live definition changed: PausedToolChangedError, from `orchestrator.paused_tools`).

On PostgreSQL the write is one autocommitted statement (`DECIDE_PG`) on the pool that is not
pinged before use, where the general path costs a ping, BEGIN, eight statements and COMMIT. It
stays correct under racing writers because its locks come in the order every writer of a run
takes them, and because what it counts is read from rows it locked:

- the run's row first (FOR UPDATE, as `trees.lock_run`): a cancel, a deadline, another decision
  take turns with it, and the row it reads is the latest version (READ COMMITTED re-reads a row
  it waited for);
- then the run's pending requirements (FOR UPDATE, in id order): locked rows are the latest
  versions too, so a requirement another decider decided while this one waited for the run's
  lock no longer counts as pending, though the statement's snapshot is older. Of two deciders of
  the last two requirements the second always sees the first's decision, and resumes the run.
  (No requirement is written for a run while it is PAUSED: a pause moves a RUNNING run.)

On SQLite the same guards run in one `BEGIN IMMEDIATE` transaction of three or four prebuilt
statements (the database lock orders the writers).
"""

from __future__ import annotations

import json
import sys
from collections import namedtuple
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Connection,
    Float,
    Integer,
    String,
    Text,
    bindparam,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.engine import Row

from orchestrator.requirements import Decision, RunRequirement, answered_by
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus, transition
from orchestrator.store import direct
from orchestrator.store.outbox import due_at
from orchestrator.store.requirement_rows import from_row
from orchestrator.store.tables import agent_catalog, events, requirements, runs

if TYPE_CHECKING:
    from orchestrator.store.backend import Backend

S = RunStatus
R = requirements
#: How many pause types a decision's kind answers at most (a reject: three).
_TYPES = 3
#: `since` for a decision checked against no catalog definition: none was seen after it.
_UNCHECKED = sys.float_info.max


def head(detail: dict[str, Any]) -> str:
    """An event's detail text as `Store.log_event` writes it, up to the run's position
    (`writes.position`), which follows: `n_messages`, then `epoch`."""
    return json.dumps(detail, default=str)[:-1] + ', "n_messages": '


#: The "resume" event's detail up to its position (`Store.move` logs where the run moved `to`).
_RESUME_HEAD = head({"to": S.QUEUED.value})
_EPOCH = ', "epoch": '


@dataclass(frozen=True, kw_only=True)
class Decided:
    """What a decision did: the requirement as stored, whether it was decided so before (the same
    decision sent again), and the run it queued again when it was the last one (None otherwise),
    with the teams above it it moved back to WAITING."""

    requirement: RunRequirement
    already: bool = False
    resumed: RunRecord | None = None
    teams: tuple[RunRecord, ...] = ()


@dataclass(frozen=True)
class AtOnce:
    """What a decision stored at once wrote: the requirement's row as decided, and the run's row
    when it was the last one and the run was queued again (None otherwise)."""

    requirement: Any
    resumed: RunRecord | None


def at_once(
    backend: Backend,
    run_id: str,
    requirement_id: str,
    decision: Decision,
    *,
    by: str | None,
    now: float,
    publish_grace: float,
    since: float | None = None,
) -> Decided | None:
    """The decision stored at once if it is the common case (see the module docstring); None,
    and nothing written, if it is not: the general path answers it. `since`: catalog definitions
    seen since then are live, and another one of the requirement's agent than the one that
    paused it leaves the decision to the general path (None: the catalog is not asked)."""
    types = answered_by(decision)
    if types is None:
        return None
    publish_after = due_at(S.QUEUED, now, publish_grace=publish_grace)
    assert publish_after is not None
    bound = params(run_id, requirement_id, decision, types, by=by, now=now, publish_after=publish_after, since=since)
    wrote = backend.decide_at_once(bound)
    if wrote is None:
        return None
    return Decided(requirement=from_row(wrote.requirement), resumed=wrote.resumed)


def params(
    run_id: str,
    requirement_id: str,
    decision: Decision,
    types: Sequence[str],
    *,
    by: str | None,
    now: float,
    publish_after: float,
    since: float | None = None,
) -> dict[str, Any]:
    """The bound values of the statements here. `types`: the pause types the decision answers
    (`answered_by`); the "decision" event's detail is written as `Store.log_event` writes it;
    `since`: as `at_once` takes it."""
    padded = [*types, *[types[-1]] * (_TYPES - len(types))]  # IN (a, b, b): unused places repeat one
    return {
        "b_id": requirement_id,
        "b_run_id": run_id,
        "b_now": now,
        **{f"b_t{i}": t for i, t in enumerate(padded)},
        "b_decision": json.dumps(decision.to_json()),
        "b_by": (by or "")[:128] or None,
        "b_publish_after": publish_after,
        "b_since": _UNCHECKED if since is None else since,
        "b_head": head({"requirement": requirement_id, "by": by, "decision": decision.describe()}),
    }


def _open(table: Any, where_run: Any) -> list[Any]:
    """The guards of the requirement decided (`table`: `ratchet_requirements` or an alias),
    besides its run's."""
    now = bindparam("b_now", type_=Float)
    return [
        table.c.id == bindparam("b_id", type_=String),
        where_run,
        table.c.root_run_id == bindparam("b_run_id", type_=String),
        table.c.status == "pending",
        table.c.deadline_at.is_(None) | (table.c.deadline_at > now),
        table.c.pause_type.in_([bindparam(f"b_t{i}", type_=String) for i in range(_TYPES)]),
        _as_paused(table),
    ]


def _before_deadline(table: Any) -> Any:
    """The run (`table`: `ratchet_runs` or an alias) has no deadline of its own, or it is ahead."""
    return table.c.deadline_at.is_(None) | (table.c.deadline_at > bindparam("b_now", type_=Float))


def _as_paused(table: Any) -> Any:
    """No definition of the requirement's agent is live (seen since `b_since`) but the one whose
    worker paused it (none at all: the catalog cannot tell, and the worker checks)."""
    k = agent_catalog.alias("k")
    return ~exists().where(
        k.c.name == table.c.agent_name,
        k.c.last_seen >= bindparam("b_since", type_=Float),
        table.c.definition_hash.is_(None) | (k.c.definition_hash != table.c.definition_hash),
    )


_DECIDED = dict(
    status="decided",
    decision=bindparam("b_decision", type_=Text),
    decided_by=bindparam("b_by", type_=String),
    decided_at=bindparam("b_now", type_=Float),
)
#: The columns of a decided requirement that `requirement_rows.from_row` reads.
_READ = [c.name for c in R.c if c.name not in ("root_run_id", "agent_name", "seq", "definition_hash", "tool_digest")]


def _resumed(table: Any) -> dict[str, Any]:
    """What the move PAUSED -> QUEUED writes (`Store.move`'s, with `bump_epoch`)."""
    return dict(
        status=transition((S.PAUSED,), S.QUEUED),
        epoch=table.c.epoch + 1,
        updated_at=bindparam("b_now", type_=Float),
        publish_after=bindparam("b_publish_after", type_=Float),
    )


def _detail(head: Any, n_messages: Any, epoch: Any) -> Any:
    """An event's detail text: `head` (the JSON object up to its position), then the position."""
    return head + sql_cast(n_messages, String) + _EPOCH + sql_cast(epoch, String) + "}"


def _decide_pg() -> Any:
    # Short aliases: a statement past 4 kB is parsed again by psycopg on every call.
    t, q = runs.alias("t"), R.alias("q")
    # Aliased targets of UPDATE (`UPDATE ratchet_runs AS u`), which SQLAlchemy's types do not know.
    u: Any = runs.alias("u")
    # The CTEs have one-letter names: every run column is named twice in the SQL, and the
    # statement must stay under the 4096 bytes past which psycopg parses it on every call.
    run = (
        select(t.c.run_id, t.c.epoch, t.c.seq, t.c.n_messages)
        .where(
            t.c.run_id == bindparam("b_run_id", type_=String),
            t.c.status == S.PAUSED.value,
            t.c.parent_run_id.is_(None),
            _before_deadline(t),
        )
        .with_for_update()
        .cte("t0")
    )
    asked = (
        select(q.c.id)
        .select_from(q.join(run, q.c.run_id == run.c.run_id))
        .where(q.c.status == "pending")
        .order_by(q.c.id)
        .with_for_update(of=q)
        .cte("a")
    )
    r: Any = R.alias("r")
    decided = (
        update(r)
        .where(*_open(r, r.c.id.in_(select(asked.c.id))))
        .values(**_DECIDED)
        .returning(*(r.c[c] for c in _READ))
        .cte("d")
    )
    others = select(func.count()).select_from(asked).where(asked.c.id != bindparam("b_id", type_=String))
    moved = (
        update(u)
        .where(
            u.c.run_id == select(decided.c.run_id).scalar_subquery(),
            u.c.status == S.PAUSED.value,
            u.c.epoch == select(run.c.epoch).scalar_subquery(),
            others.scalar_subquery() == 0,
        )
        .values(**_resumed(u))
        .returning(*u.c)
        .cte("m")
    )
    logged = _logged(run, decided, moved)
    return (
        select(*(decided.c[c].label(f"q_{c}") for c in _READ), *moved.c)
        .select_from(decided.outerjoin(moved, true()))
        .add_cte(logged)
    )


def _logged(run: Any, decided: Any, moved: Any) -> Any:
    """The events of a decision stored at once: the decision, then (when it resumed its run) the
    resume, in that order, as the general path logs them."""
    now = bindparam("b_now", type_=Float)
    logged_decision = select(
        decided.c.run_id.label("run_id"),
        now.label("at"),
        literal("decision", String).label("kind"),
        run.c.seq.label("seq"),
        _detail(bindparam("b_head", type_=String), run.c.n_messages, run.c.epoch).label("detail"),
        literal(1, Integer).label("ord"),
    ).select_from(decided.join(run, true()))
    logged_resume = select(
        moved.c.run_id,
        now,
        literal("resume", String),
        moved.c.seq,
        _detail(literal(_RESUME_HEAD, String), moved.c.n_messages, moved.c.epoch),
        literal(2, Integer),
    )
    both = logged_decision.union_all(logged_resume).subquery("e")
    columns = ["run_id", "at", "kind", "seq", "detail"]
    logged = insert(events).from_select(columns, select(*(both.c[c] for c in columns)).order_by(both.c.ord)).cte("l")
    return logged


#: PostgreSQL, autocommitted: the decision stored, logged, and the run resumed if it was the last
#: (see the module docstring); bind `params`. One row (the requirement's columns as `q_<column>`,
#: the resumed run's as they are, NULL when not resumed), or none, and nothing written.
DECIDE_PG = _decide_pg()

_run_paused = exists().where(
    runs.c.run_id == bindparam("b_run_id", type_=String),
    runs.c.status == S.PAUSED.value,
    runs.c.parent_run_id.is_(None),
    _before_deadline(runs),
)
#: SQLite: the requirement decided if the guards hold (its run's among them); its row, or none.
DECIDE_SQLITE = (
    update(R)
    .where(*_open(R, R.c.run_id == bindparam("b_run_id", type_=String)), _run_paused)
    .values(**_DECIDED)
    .returning(*R.c)
)
#: SQLite: the run and how many of its requirements are pending (the one decided is not).
RUN_PENDING_SQLITE = select(
    runs,
    select(func.count())
    .select_from(R)
    .where(R.c.run_id == runs.c.run_id, R.c.status == "pending")
    .scalar_subquery()
    .label("pending"),
).where(runs.c.run_id == bindparam("b_run_id", type_=String))
#: SQLite: the run PAUSED -> QUEUED at the epoch read (under the database lock).
RESUME_SQLITE = (
    update(runs)
    .where(
        runs.c.run_id == bindparam("b_run_id", type_=String),
        runs.c.status == S.PAUSED.value,
        runs.c.epoch == bindparam("b_epoch", type_=Integer),
    )
    .values(**_resumed(runs))
    .returning(*runs.c)
)
#: An event row; bind every column of `ratchet_events` but its id by name.
INSERT_EVENT = insert(events).values({c.name: bindparam(c.name, type_=c.type) for c in events.c if c.name != "id"})

_Requirement = namedtuple("_Requirement", _READ)  # type: ignore[misc]


class _RunRow:
    """A run's columns out of a wider row, as `RunRecord.from_row` reads them."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._mapping = values


def decide_pg(conn: Connection, bound: dict[str, Any]) -> AtOnce | None:
    """`DECIDE_PG` on `conn` (autocommitted); what it wrote, or None (nothing)."""
    row = direct.first(conn, DECIDE_PG, bound)
    if row is None:
        return None
    values = row._mapping
    requirement = _Requirement(*(values[f"q_{c}"] for c in _READ))
    resumed = RunRecord.from_row(_RunRow(values)) if values["run_id"] is not None else None
    return AtOnce(requirement=requirement, resumed=resumed)


def decide_sqlite(conn: Connection, bound: dict[str, Any]) -> AtOnce | None:
    """The SQLite statements on `conn`, in its `BEGIN IMMEDIATE` transaction; what they wrote, or
    None (nothing)."""
    requirement: Row[Any] | None = direct.first(conn, DECIDE_SQLITE, bound)
    if requirement is None:
        return None
    row = direct.first(conn, RUN_PENDING_SQLITE, {"b_run_id": bound["b_run_id"]})
    run = RunRecord.from_row(row)
    now = bound["b_now"]
    logged = [_event(run, "decision", now, bound["b_head"])]
    resumed = None
    if not row.pending:
        moved = direct.first(conn, RESUME_SQLITE, {**bound, "b_epoch": run.epoch})
        assert moved is not None, "the run is PAUSED under the database lock"
        resumed = RunRecord.from_row(moved)
        logged.append(_event(resumed, "resume", now, _RESUME_HEAD))
    direct.many(conn, INSERT_EVENT, logged)
    return AtOnce(requirement=requirement, resumed=resumed)


def _event(run: RunRecord, kind: str, now: float, head: str) -> dict[str, Any]:
    """An event row of the run, its detail `head` completed with the run's position."""
    detail = f"{head}{run.n_messages}{_EPOCH}{run.epoch}}}"
    return {"run_id": run.run_id, "at": now, "kind": kind, "seq": run.seq, "detail": detail}
