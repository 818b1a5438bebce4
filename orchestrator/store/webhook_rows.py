"""The webhook outbox's rows (`ratchet_webhook_deliveries`): written with a run's stop, read and
settled by the sweeper's delivery pass (`orchestrator.webhooks`).

A stop of a run with a webhook writes its row in the transaction of the move, so a delivery is
owed exactly when the stop committed: `Store.move` and SQLite's step commit call `enqueue` (one
more statement, only for runs with a webhook); PostgreSQL's final step commit carries the INSERT
in its one statement (`STOPPED_PG`), so a run without a webhook costs no round trip.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection, Engine, Float, String, bindparam, func, insert, literal, select, update
from sqlalchemy.dialects import postgresql

from orchestrator.errors import RunNotFoundError
from orchestrator.run import RunRecord
from orchestrator.store.tables import runs
from orchestrator.store.tables import webhook_deliveries as wd

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def delivery_id(run_id: str, epoch: int, status: str) -> str:
    """One stop's id, readable (`run.epoch.status.`) and made unique by a random tail: the run,
    epoch and status alone repeat (a team goes PAUSED -> WAITING without a new epoch, so its next
    pause is the same triple). The guarded move writes each stop once, so a random tail never
    makes two rows of one stop."""
    return f"{run_id}.{epoch}.{status}.{uuid.uuid4().hex[:16]}"


def enqueue(conn: Connection, record: RunRecord) -> None:
    """Owe a delivery of the stop `record` is at (a no-op for a run without a webhook). The
    caller's move is guarded, so one stop is written once."""
    if record.webhook is None:
        return
    row = dict(
        delivery_id=delivery_id(record.run_id, record.epoch, record.status.value),
        run_id=record.run_id,
        session_id=record.session_id,
        agent_name=record.agent_name,
        url=record.webhook,
        run_status=record.status.value,
        seq=record.seq,
        content=record.content,
        error_type=record.error_type,
        error_message=record.error_message,
        created_at=record.updated_at,
        state=PENDING,
        attempts=0,
        next_attempt_at=record.updated_at,
    )
    conn.execute(insert(wd).values(row))


def stopped_pg(moved: Any) -> Any:
    """PostgreSQL: the INSERT of the delivery the run `moved` (a CTE returning the moved row)
    owes, as a CTE of the same statement; it writes nothing for a run without a webhook."""
    now = bindparam("b_now", type_=Float)
    tail = func.substr(func.replace(func.cast(func.gen_random_uuid(), String), "-", ""), 1, 16)
    ident = func.concat(moved.c.run_id, ".", moved.c.epoch, ".", moved.c.status, ".", tail)  # as `delivery_id`
    rows = select(
        ident,
        moved.c.run_id,
        moved.c.session_id,
        moved.c.agent_name,
        moved.c.webhook,
        moved.c.status,
        moved.c.seq,
        moved.c.content,
        moved.c.error_type,
        moved.c.error_message,
        now,
        literal(PENDING, type_=String),
        literal(0),
        now,
    ).where(moved.c.webhook.is_not(None))
    columns = [
        "delivery_id", "run_id", "session_id", "agent_name", "url", "run_status", "seq", "content",
        "error_type", "error_message", "created_at", "state", "attempts", "next_attempt_at",
    ]  # fmt: skip
    return postgresql.insert(wd).from_select(columns, rows).on_conflict_do_nothing().cte("moved_webhook")


class WebhookOutbox:
    """The outbox's reads and writes outside a move (`Store.webhooks`), each its own transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def due(self, now: float, limit: int) -> list[Any]:
        """The pending deliveries due by `now`, oldest first."""
        query = (
            select(wd)
            .where(wd.c.state == PENDING, wd.c.next_attempt_at <= now)
            .order_by(wd.c.next_attempt_at)
            .limit(limit)
        )
        with self.engine.begin() as conn:
            return list(conn.execute(query))

    def settle(
        self,
        delivery: str,
        *,
        attempts: int,
        state: str,
        now: float,
        next_attempt_at: float | None,
        error: str | None,
    ) -> None:
        """Record one attempt's outcome: delivered, failed for good, or pending until `next_attempt_at`."""
        with self.engine.begin() as conn:
            conn.execute(
                update(wd)
                .where(wd.c.delivery_id == delivery, wd.c.state == PENDING)
                .values(
                    attempts=attempts,
                    state=state,
                    next_attempt_at=next_attempt_at,
                    last_error=error,
                    delivered_at=now if state == DELIVERED else None,
                )
            )

    def of_run(self, run_id: str) -> list[dict[str, Any]]:
        """The run's deliveries, oldest first; RunNotFoundError if there is no such run."""
        query = select(wd).where(wd.c.run_id == run_id).order_by(wd.c.created_at, wd.c.delivery_id)
        with self.engine.begin() as conn:
            rows = [dict(row._mapping) for row in conn.execute(query)]
            if not rows and conn.execute(select(runs.c.run_id).where(runs.c.run_id == run_id)).first() is None:
                raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")
        return rows
