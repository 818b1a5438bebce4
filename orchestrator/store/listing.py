"""Listing runs: filters, keyset pages in (created_at, run_id) order, and the cursor between pages.

A page is read with a keyset, not an offset: the next page starts after the last row of this one,
`(created_at, run_id) < (last.created_at, last.run_id)` newest first, so page 1,000 costs what
page 1 costs, and a run written meanwhile neither shifts a page nor repeats a row.

Each status's runs are one range of `ix_ratchet_runs_status_listing` (status, created_at, run_id),
or of `ix_ratchet_runs_agent_listing` within an agent: a filter on one status reads `limit` index
entries. A filter on several statuses, or none, reads each status's range (at most `limit` rows
each) and merges them, because neither database can read one index in created_at order across
several of its leading values (migration 0007). A filter on a session or a user, without a status,
reads that column's index instead.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, select, tuple_, union_all

from orchestrator.errors import InvalidInputError
from orchestrator.run import RunPage, RunSummary
from orchestrator.status import RunStatus
from orchestrator.store.schema import runs

#: The columns a summary shows: not the transcript, the prompt or the answer.
SUMMARY = (
    runs.c.run_id, runs.c.session_id, runs.c.agent_name, runs.c.kind, runs.c.status, runs.c.parent_run_id,
    runs.c.forked_from, runs.c.user_id, runs.c.error_type, runs.c.error_message, runs.c.seq, runs.c.retries,
    runs.c.n_messages, runs.c.created_at, runs.c.updated_at,
)  # fmt: skip
#: A position in the (created_at, run_id) order.
Key = tuple[float, str]
_CURSOR_VERSION = 1


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
    #: Also member runs of teams (default: top-level runs only, each team's members under it).
    members: bool = False

    def conditions(self) -> list[ColumnElement[bool]]:
        """The WHERE conditions of this filter, but the status."""
        where: list[ColumnElement[bool]] = []
        if self.agent is not None:
            where.append(runs.c.agent_name == self.agent)
        if self.session_id is not None:
            where.append(runs.c.session_id == self.session_id)
        if self.user_id is not None:
            where.append(runs.c.user_id == self.user_id)
        if self.since is not None:
            where.append(runs.c.created_at >= self.since)
        if self.until is not None:
            where.append(runs.c.created_at < self.until)
        if not self.members:
            where.append(runs.c.parent_run_id.is_(None))
        return where


def list_runs(conn: Connection, filter: RunFilter, *, limit: int, cursor: str | None = None) -> RunPage:
    """One page of the runs `filter` selects, newest first, after the position `cursor` names."""
    after = None if cursor is None else decode_cursor(cursor)
    rows = conn.execute(ordered(filter, columns=SUMMARY, limit=limit + 1, after=after, newest_first=True)).all()
    summaries = [RunSummary.from_row(r) for r in rows[:limit]]
    more = len(rows) > limit
    last = summaries[-1] if summaries else None
    return RunPage(runs=summaries, next_cursor=encode_cursor((last.created_at, last.run_id)) if more and last else None)


def ordered(
    filter: RunFilter,
    *,
    columns: Sequence[Any],
    limit: int,
    after: Key | None = None,
    newest_first: bool = True,
    extra: Sequence[ColumnElement[bool]] = (),
) -> Select[Any]:
    """A SELECT of `columns` of the first `limit` runs of `filter` (and `extra`) after the
    position `after`, in (created_at, run_id) order: one index range per status (see above).
    `columns` must include created_at and run_id."""
    where = [*filter.conditions(), *extra]
    if after is not None:
        position = tuple_(runs.c.created_at, runs.c.run_id)
        where.append(position < tuple_(*after) if newest_first else position > tuple_(*after))
    statuses: Sequence[RunStatus | None] = filter.statuses
    if not statuses:
        # No status asked for: a session's or a user's index gives the order; else each status's range.
        statuses = [None] if filter.session_id or filter.user_id else list(RunStatus)
    parts = [_range(columns, [*where, *_status(s)], limit, newest_first) for s in statuses]
    if len(parts) == 1:
        return parts[0]
    merged = union_all(*(select(part.subquery()) for part in parts)).subquery()
    return select(merged).order_by(*_order(merged.c, newest_first)).limit(limit)


def _status(status: RunStatus | None) -> list[ColumnElement[bool]]:
    return [] if status is None else [runs.c.status == status.value]


def _range(columns: Sequence[Any], where: list[ColumnElement[bool]], limit: int, newest_first: bool) -> Select[Any]:
    return select(*columns).where(*where).order_by(*_order(runs.c, newest_first)).limit(limit)


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
        if version != _CURSOR_VERSION or not isinstance(run_id, str):
            raise ValueError(version)
        return float(created_at), run_id
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise InvalidInputError(
            f"cursor {cursor[:80]!r} is not one a listing returned: pass the next_cursor of the previous page as it is"
        ) from None
