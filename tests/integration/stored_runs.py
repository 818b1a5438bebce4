"""Runs written straight into a store at a time the test chooses and moved to the status it needs
through the store's guarded moves (no producer, no broker, no model): what the listing and the
retention tests read and delete."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select, update

from orchestrator.messages import Message
from orchestrator.status import RunStatus
from orchestrator.store import Store
from orchestrator.store.tables import deltas, events, messages, runs, sessions, tool_starts

S = RunStatus
#: The moves from QUEUED that leave a run in each status. A PAUSED row is written as such after
#: its claim (the row a tool step's pause leaves, without its requirements: the retention and
#: listing tests need only the row).
PATHS: dict[RunStatus, tuple[RunStatus, ...]] = {
    S.QUEUED: (), S.RUNNING: (S.RUNNING,), S.COMPLETED: (S.RUNNING, S.COMPLETED), S.ERROR: (S.RUNNING, S.ERROR),
    S.CANCELLED: (S.CANCELLED,), S.WAITING: (S.RUNNING, S.WAITING), S.PAUSED: (S.RUNNING,),
}  # fmt: skip
#: Every table that holds rows of a run, and its run_id column.
TABLES = {"runs": runs, "messages": messages, "tool_starts": tool_starts, "events": events, "deltas": deltas}


def seed(
    store: Store,
    status: RunStatus = S.COMPLETED,
    *,
    agent: str = "agent-a",
    session_id: str | None = None,
    user_id: str | None = None,
    parent: str | None = None,
    kind: str = "agent",
    started: bool = False,
) -> str:
    """A run in `status`, created (and moved) at the store's clock; returns its id. `started`: its
    first step records an at-most-once tool start (a row of `ratchet_tool_starts`) on the way."""
    run_id = str(uuid.uuid4())
    store.create_run(
        run_id=run_id, session_id=session_id or f"s-{run_id[:8]}", agent_name=agent, kind=kind,
        input_messages=[Message(role="user", content="hello")], publish_grace=60, parent_run_id=parent,
        parent_tool_call_id=None if parent is None else "call-1", user_id=user_id,
    )  # fmt: skip
    src = S.QUEUED
    for dst in PATHS[status]:
        if dst == S.RUNNING:
            claim = store.claim(run_id, 0, "model", owner=f"w-{run_id[:8]}", lease_seconds=600, max_attempts=5)
            assert claim is not None
            if started:
                store.record_tool_start(claim, "call-1", "charge_card")
        else:
            error = {"error_type": "ModelCallError", "error_message": "it broke"} if dst == S.ERROR else {}
            assert store.move(run_id, src=(src,), dst=dst, event=dst.value.lower(), **error) is not None
        src = dst
    if status == S.PAUSED:
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == run_id).values(status=S.PAUSED.value))
    return run_id


def rows_of(store: Store, run_ids: list[str]) -> dict[str, int]:
    """How many rows each table holds for these runs."""
    with store.engine.connect() as conn:
        return {
            name: conn.execute(select(func.count()).select_from(t).where(t.c.run_id.in_(run_ids))).scalar_one()
            for name, t in TABLES.items()
        }


def session_exists(store: Store, session_id: str) -> bool:
    with store.engine.connect() as conn:
        return (
            conn.execute(select(sessions.c.session_id).where(sessions.c.session_id == session_id)).first() is not None
        )
