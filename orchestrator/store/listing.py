"""Listing runs: filters, keyset pages in (created_at, run_id) order, and the cursor between pages.

A page is read with a keyset, not an offset: the next page starts after the last row of this one,
`(created_at, run_id) < (last.created_at, last.run_id)` newest first, so page 1,000 costs what
page 1 costs, and a run written meanwhile neither shifts a page nor repeats a row.

Each status's runs are one range of `ix_ratchet_runs_status_listing` (status, created_at, run_id),
or of `ix_ratchet_runs_agent_listing` within an agent: a filter on one status reads `limit` index
entries. A filter on several statuses, or none, reads each status's range (at most `limit` rows
each) and merges them (PostgreSQL: a Merge Append), because neither database can read one index
in created_at order across several of its leading values (migration 0007). A filter on a session
or a user, without a status, reads that column's index instead.

Both indexes leave out QUEUED and RUNNING runs (`STEPPING`): a run moves between those two at
every step, and an index holding them would take two more entries a step. Runs in them are few
(what the workers hold and the backlog), read by the sweeper's index on status and sorted.
Every other range's query carries the indexes' condition word for word (`SETTLED`), which is how
SQLite, and PostgreSQL with a generic plan, know the partial index holds the rows asked for.

The statement of each shape of filter (which conditions, how many statuses) is built once with
bound parameters and kept: building a seven-way union costs more than running it (as with the
hot statements, `statements.py`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Float, Integer, Select, String, bindparam, select, text, tuple_, union_all

from orchestrator import validation
from orchestrator.errors import InvalidInputError
from orchestrator.run import RunPage, RunSummary
from orchestrator.status import RunStatus
from orchestrator.store.tables import runs

#: The columns a summary shows: not the transcript, the prompt or the answer.
SUMMARY = (
    "run_id",
    "session_id",
    "agent_name",
    "kind",
    "status",
    "parent_run_id",
    "forked_from",
    "user_id",
    "error_type",
    "error_message",
    "seq",
    "retries",
    "n_messages",
    "created_at",
    "updated_at",
)
#: The statuses a run moves between at every step: kept out of the listing indexes.
STEPPING = (RunStatus.QUEUED, RunStatus.RUNNING)
#: The listing indexes' condition (tables.py, migration 0007), as each query of theirs carries it.
SETTLED = "status NOT IN ('QUEUED', 'RUNNING')"
#: A position in the (created_at, run_id) order.
Key = tuple[float, str]
_CURSOR_VERSION = 1
#: The optional conditions of a filter: its field, the column, how it compares, the bound type.
_CONDITIONS = (
    ("agent", "agent_name", "==", String),
    ("session_id", "session_id", "==", String),
    ("user_id", "user_id", "==", String),
    ("since", "created_at", ">=", Float),
    ("until", "created_at", "<", Float),
    ("updated_before", "updated_at", "<", Float),
)


@dataclass(frozen=True, kw_only=True)
class RunFilter:
    """Which runs a listing shows (every condition given must hold)."""

    #: Runs in any of these statuses (empty: any status).
    statuses: tuple[RunStatus, ...] = ()
    agent: str | None = None
    session_id: str | None = None
    user_id: str | None = None
    #: Created at or after (UNIX seconds).
    since: float | None = None
    #: Created before (UNIX seconds).
    until: float | None = None
    #: Last changed before (UNIX seconds): what a prune looks for.
    updated_before: float | None = None
    #: Also member runs of teams (default: top-level runs only, each team's members under it).
    members: bool = False

    def ranges(self) -> tuple[RunStatus | None, ...]:
        """The statuses read one index range each; (None,): one range of the session's or the
        user's index, any status."""
        if self.statuses:
            return self.statuses
        return (None,) if self.session_id or self.user_id else tuple(RunStatus)


def list_runs(conn: Connection, filter: RunFilter, *, limit: int, cursor: str | None = None) -> RunPage:
    """One page of the runs `filter` selects, newest first, after the position `cursor` names."""
    after = None if cursor is None else decode_cursor(cursor)
    rows = conn.execute(*ordered(filter, columns=SUMMARY, limit=limit + 1, after=after)).all()
    summaries = [RunSummary.from_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    last = summaries[-1] if summaries else None
    return RunPage(runs=summaries, next_cursor=encode_cursor((last.created_at, last.run_id)) if more and last else None)


def ordered(
    filter: RunFilter, *, columns: tuple[str, ...], limit: int, after: Key | None = None, newest_first: bool = True
) -> tuple[Select[Any], dict[str, Any]]:
    """The SELECT of `columns` (which must include created_at and run_id) of the first `limit`
    runs of `filter` after the position `after`, in (created_at, run_id) order, and its
    parameters: one index range per status (see above)."""
    ranges = filter.ranges()
    given = tuple(field for field, *_ in _CONDITIONS if getattr(filter, field) is not None)
    kinds = tuple("any" if s is None else "stepping" if s in STEPPING else "settled" for s in ranges)
    statement = _statement(columns, given, kinds, filter.members, after is not None, newest_first)
    params: dict[str, Any] = {f"b_{field}": getattr(filter, field) for field in given}
    params.update((f"b_status_{i}", status.value) for i, status in enumerate(ranges) if status is not None)
    params["b_limit"] = limit
    if after is not None:
        params.update(b_after_at=after[0], b_after_id=after[1])
    return statement, params


@lru_cache(maxsize=512)
def _statement(
    columns: tuple[str, ...],
    given: tuple[str, ...],
    kinds: tuple[str, ...],
    members: bool,
    after: bool,
    newest_first: bool,
) -> Select[Any]:
    """The statement of one shape of listing, with its values as bound parameters. `kinds`: one
    range a status, "settled" (in the listing indexes) or "stepping" (not), or one "any"."""
    where = []
    for field, column, op, type_ in _CONDITIONS:
        if field in given:
            value = bindparam(f"b_{field}", type_=type_)
            c = runs.c[column]
            where.append(c == value if op == "==" else c >= value if op == ">=" else c < value)
    if not members:
        where.append(runs.c.parent_run_id.is_(None))
    if after:
        position = tuple_(runs.c.created_at, runs.c.run_id)
        bound = tuple_(bindparam("b_after_at", type_=Float), bindparam("b_after_id", type_=String))
        where.append(position < bound if newest_first else position > bound)
    limit = bindparam("b_limit", type_=Integer)
    selected = [runs.c[name] for name in columns]

    def part(i: int, kind: str) -> Select[Any]:
        status: list[Any] = [] if kind == "any" else [runs.c.status == bindparam(f"b_status_{i}", type_=String)]
        if kind == "settled":
            status.append(text(f"{runs.name}.{SETTLED}"))
        return select(*selected).where(*where, *status).order_by(*_order(runs.c, newest_first)).limit(limit)

    if len(kinds) == 1:
        return part(0, kinds[0])
    merged = union_all(*(select(part(i, kind).subquery()) for i, kind in enumerate(kinds))).subquery()
    return select(merged).order_by(*_order(merged.c, newest_first)).limit(limit)


def _order(c: Any, newest_first: bool) -> list[Any]:
    if newest_first:
        return [c.created_at.desc(), c.run_id.desc()]
    return [c.created_at.asc(), c.run_id.asc()]


def encode_cursor(key: Key) -> str:
    """The opaque cursor of a position: URL-safe text a client passes back as it is."""
    raw = json.dumps([_CURSOR_VERSION, key[0], key[1]], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> Key:
    """The position a cursor names, or InvalidInputError if it is not one `encode_cursor` made."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        version, created_at, run_id = json.loads(raw)
        if version != _CURSOR_VERSION or not isinstance(run_id, str) or not math.isfinite(float(created_at)):
            raise ValueError(version)
        return float(created_at), validation.known_run_id(run_id)
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError, OverflowError, InvalidInputError):
        raise InvalidInputError(
            f"cursor {cursor[:80]!r} is not one a listing returned: pass the next_cursor of the previous page as it is"
        ) from None
