"""The store's session rows: their state and user, functions of a connection.

A change of a session's state is applied to the row as it is when the change commits, under the
row's lock (PostgreSQL: FOR UPDATE; SQLite: every write transaction holds the database lock from
BEGIN IMMEDIATE), key by key (`orchestrator.state`): two calls that change different keys at once
both land, whatever order they commit in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Row, select, update

from orchestrator import state
from orchestrator.errors import SessionOwnedError
from orchestrator.state import StateChange
from orchestrator.store import direct, statements
from orchestrator.store.schema import sessions


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


def apply(conn: Connection, session_id: str, changes: Sequence[StateChange]) -> None:
    """Apply `changes` to the session's state, in the caller's transaction."""
    if changes:
        _rewrite(conn, session_id, lambda current: state.apply(current, changes))


def add_defaults(conn: Connection, session_id: str, defaults: Mapping[str, Any]) -> None:
    """Add the keys of `defaults` the session's state lacks (an agent's `session_state=`)."""
    if defaults:
        _rewrite(conn, session_id, lambda current: state.with_defaults(current, defaults))


def _rewrite(conn: Connection, session_id: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    locked = conn.execute(
        select(sessions.c.session_state).where(sessions.c.session_id == session_id).with_for_update()
    ).first()
    if locked is None:
        return
    current = state.from_json(locked.session_state)
    new = change(current)
    if new != current:
        # Not bounded here: each change was, and a commit must not fail on what a tool already did.
        text = state.to_json(new, limit=None)
        conn.execute(update(sessions).where(sessions.c.session_id == session_id).values(session_state=text))
