"""The store's session rows: their state and user, functions of a connection.

A session is its first run's user's (None included): the write of a run for another user is
refused (`refused`, raised by `Backend.create`). Its state is that user's too: a run reads it and
changes it only if its user is the session's. A store written before that rule can hold runs of
other users in a session; such a run sees an empty state, and what its tools change is not kept
(logged), so that no run ever reads or writes another user's state.

A change of a session's state is applied to the row as it is when the change commits, under the
row's lock (PostgreSQL: FOR UPDATE; SQLite: every write transaction holds the database lock from
BEGIN IMMEDIATE), key by key (`orchestrator.state`): two calls that change different keys at once
both land, whatever order they commit in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, select, update

from orchestrator import state
from orchestrator.errors import SessionOwnedError
from orchestrator.run import RunRecord
from orchestrator.state import StateChange
from orchestrator.store import direct, statements
from orchestrator.store.tables import sessions

log = logging.getLogger("ratchet.store")


def refused(session_id: str) -> SessionOwnedError:
    """The refusal of a run for another user than the session's: it names the session, which its
    producer gave, and neither user."""
    return SessionOwnedError(
        f"session {session_id!r} belongs to another user: a session takes runs only for the user_id its "
        "first run had (none is a user_id too), so this run was not written. Start it with a new session_id, "
        "or none (a new session is made)"
    )


def row(conn: Connection, session_id: str) -> Row[Any, Any] | None:
    """The session's row (its user and state), None if there is no such session."""
    query = select(sessions.c.user_id, sessions.c.session_state).where(sessions.c.session_id == session_id)
    return conn.execute(query).first()


def read_state(conn: Connection, session_id: str) -> dict[str, Any]:
    """The session's state ({} when none was set, or no such session)."""
    row = direct.first(conn, statements.SESSION_STATE, {"b_session_id": session_id})
    return state.from_json(row[0] if row is not None else None)


def run_state(conn: Connection, run: RunRecord) -> dict[str, Any]:
    """The state `run` sees: its session's, or {} when the session is another user's (above)."""
    return user_state(conn, run.session_id, run.user_id)


def user_state(conn: Connection, session_id: str, user_id: str | None) -> dict[str, Any]:
    """The session's state if the session is `user_id`'s (None: a session of no user), else {}."""
    row = direct.first(conn, statements.RUN_STATE, {"b_session_id": session_id, "b_user_id": user_id})
    return state.from_json(row[0] if row is not None else None)


def apply(conn: Connection, run: RunRecord, changes: Sequence[StateChange]) -> None:
    """Apply `changes`, made by `run`'s tools, to its session's state, in the caller's transaction."""
    if changes:
        _rewrite(conn, run, lambda current: state.apply(current, changes))


def add_defaults(conn: Connection, run: RunRecord, defaults: Mapping[str, Any]) -> None:
    """Add the keys of `defaults` (`run`'s agent's `session_state=`) its session's state lacks."""
    if defaults:
        _rewrite(conn, run, lambda current: state.with_defaults(current, defaults))


def _rewrite(conn: Connection, run: RunRecord, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    session_id = run.session_id
    locked = conn.execute(
        select(sessions.c.user_id, sessions.c.session_state)
        .where(sessions.c.session_id == session_id)
        .with_for_update()
    ).first()
    if locked is None:
        return
    if locked.user_id != run.user_id:  # a run written before sessions took one user: not its state
        log.warning("run %s: its session is another user's; its change to the session state is not kept", run.run_id)
        return
    current = state.from_json(locked.session_state)
    new = change(current)
    if new != current:
        # Not bounded here: each change was, and a commit must not fail on what a tool already did.
        text = state.to_json(new, limit=None)
        conn.execute(update(sessions).where(sessions.c.session_id == session_id).values(session_state=text))
