"""Session history: which earlier runs of its session a run's context includes, and their messages.

A run of an agent with `add_history_to_context=True` has its history fixed at its first model
step, right after the claim: the last `num_history_runs` runs of the same session and agent, at
the same level (top-level runs for a top-level run, member runs for a member), created before it
and COMPLETED at that moment, each with its message count then. Runs in ERROR or CANCELLED are
skipped, as Agno skips them, and so are runs still going (QUEUED, RUNNING, WAITING, PAUSED): Agno
reads a crashed RUNNING run's half-written transcript; Ratchet never does, so two runs of one
session started together never see each other's partial messages.

The choice is stored on the run (`ratchet_runs.history`, JSON `[[run_id, n_messages], ...]`,
oldest first) with a write fenced by the claim, so every later attempt of the run (a retry, a
recovery after a crash, a continue) reads the same list and the same prefixes of those runs'
messages, even if the session moved on in between. The history runs' messages are immutable
rows, so a worker keeps them in memory by that JSON: only a run's first step reads them.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from sqlalchemy import Connection, select, update

from orchestrator.errors import FencedError
from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store.claims import Claim
from orchestrator.store.schema import messages, runs

#: How many distinct histories a worker keeps in memory (each a few runs' messages).
CACHED_HISTORIES = 256


def choose(conn: Connection, record: RunRecord, num_runs: int) -> str:
    """The history of `record` as JSON: its session's last `num_runs` runs that qualify (above)."""
    level = runs.c.parent_run_id.is_(None) if record.parent_run_id is None else runs.c.parent_run_id.is_not(None)
    rows = conn.execute(
        select(runs.c.run_id, runs.c.n_messages)
        .where(
            runs.c.session_id == record.session_id,
            runs.c.agent_name == record.agent_name,
            runs.c.status == RunStatus.COMPLETED.value,
            runs.c.run_id != record.run_id,
            runs.c.created_at <= record.created_at,
            level,
        )
        .order_by(runs.c.created_at.desc(), runs.c.run_id.desc())
        .limit(num_runs)
    ).all()
    return json.dumps([[r.run_id, r.n_messages] for r in reversed(rows)])


def fix(conn: Connection, claim: Claim, num_runs: int, now: float) -> str:
    """Choose the claimed run's history and store it, fenced by the claim (epoch, owner, live
    lease): the stored history, or FencedError if the claim was lost."""
    chosen = choose(conn, claim.record, num_runs)
    stored = conn.execute(
        update(runs)
        .where(
            runs.c.run_id == claim.run_id,
            runs.c.epoch == claim.epoch,
            runs.c.lease_owner == claim.record.lease_owner,
            runs.c.lease_expires_at > now,
            runs.c.history.is_(None),
        )
        .values(history=chosen)
        .returning(runs.c.history)
    ).scalar()
    if stored is None:
        raise FencedError(f"run {claim.run_id}: the claim of epoch {claim.epoch} was lost before its history was fixed")
    return str(stored)


def read(conn: Connection, history: str) -> list[Message]:
    """The messages of a stored history, run by run, without system messages."""
    chosen = [(str(run_id), int(count)) for run_id, count in json.loads(history)]
    if not chosen:
        return []
    rows = conn.execute(
        select(messages)
        .where(messages.c.run_id.in_([run_id for run_id, _ in chosen]), messages.c.role != "system")
        .order_by(messages.c.run_id, messages.c.idx)
    ).all()
    by_run: dict[str, list[Message]] = {run_id: [] for run_id, _ in chosen}
    limits = dict(chosen)
    for row in rows:
        if row.idx < limits[row.run_id]:
            by_run[row.run_id].append(Message.from_row(row))
    return [m for run_id, _ in chosen for m in by_run[run_id]]


class HistoryCache:
    """A worker's memory of histories it read: stored history JSON -> its messages (immutable)."""

    def __init__(self, size: int = CACHED_HISTORIES) -> None:
        self._size = size
        self._items: OrderedDict[str, list[Message]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, history: str) -> list[Message] | None:
        with self._lock:
            found = self._items.get(history)
            if found is not None:
                self._items.move_to_end(history)
            return found

    def put(self, history: str, items: list[Message]) -> None:
        with self._lock:
            self._items[history] = items
            self._items.move_to_end(history)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
