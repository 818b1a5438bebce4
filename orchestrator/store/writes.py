"""The run store's writes: functions of a connection, the same on SQLite and PostgreSQL.

`Store` chooses the transaction each runs in, turns a guard that did not match into a no-op or a
`FencedError`, and keeps its transcript cache current; the per-step hot path (the claim, the
commit, a new run) uses the prebuilt statements in `statements.py`.

Every write of a run's status takes its value from `status.transition`, and every write of its
outbox marker from `outbox.due_at`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, func, insert, select, tuple_, update

from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus, transition
from orchestrator.store import direct, statements
from orchestrator.store.claims import Claim, held
from orchestrator.store.outbox import due_at
from orchestrator.store.tables import runs, tool_starts
from orchestrator.untrusted import ERROR_MESSAGE_MAX, ERROR_TYPE_MAX, clip

S = RunStatus


def insert_messages(
    conn: Connection,
    run_id: str,
    start: int,
    items: Sequence[Message],
    now: float,
    *,
    seq: int | None,
    epoch: int | None,
    step_started_at: float | None = None,
    step_queued_at: float | None = None,
    definition_hash: str | None = None,
) -> None:
    """Append `items` at index `start` on, written by step `seq` at `epoch`; `step_started_at`
    and `step_queued_at`: the claim time of the step whose own commit this is, and when that
    step was queued; `definition_hash`: the definition of the worker whose step wrote them (see
    the schema)."""
    stamp = {
        "run_id": run_id,
        "created_at": now,
        "seq": seq,
        "epoch": epoch,
        "step_started_at": step_started_at,
        "step_queued_at": step_queued_at,
        "definition_hash": definition_hash,
    }
    if items:
        rows = [{**m.to_row(), **stamp, "idx": start + i} for i, m in enumerate(items)]
        direct.many(conn, statements.INSERT_MESSAGES, rows)


def new_run(fields: dict[str, Any], *, now: float, n_messages: int, publish_grace: float) -> dict[str, Any]:
    """The row of a new run: `fields`, what its creator chose (ids, agent, parent, options), and
    what every run starts with: QUEUED at seq and epoch 0, its first step a model call, no lease,
    its `n_messages` input messages counted, its outbox marker set (`publish_grace`), and its
    deadline `run_timeout` seconds from now, if `fields` gives one."""
    timeout = fields.get("run_timeout")
    return dict(
        fields,
        status=S.QUEUED.value,
        epoch=0,
        seq=0,
        next_step="model",
        n_messages=n_messages,
        lease_owner=None,
        lease_expires_at=None,
        attempts=0,
        retries=0,
        model_index=None,
        publish_after=due_at(S.QUEUED, now, publish_grace=publish_grace),
        content=None,
        error_type=None,
        error_message=None,
        created_at=now,
        updated_at=now,
        queued_at=None,
        deadline_at=None if timeout is None else now + timeout,
        wakes_session=None,
        accepted_definition=None,
    )


def move(
    conn: Connection,
    run_id: str,
    *,
    src: Iterable[RunStatus],
    dst: RunStatus,
    now: float,
    epoch: int | None,
    bump_epoch: bool,
    extra_where: Any,
    publish_grace: float | None,
    delay: float,
    values: dict[str, Any],
    waiting: bool = False,
) -> RunRecord | None:
    """Apply `src -> dst` if the run is in one of `src` (and at `epoch`), setting `values` and the
    outbox marker `dst` calls for (`publish_grace`, `delay`, `waiting`: see `outbox`); the new row or None."""
    if "publish_after" in values:
        raise TypeError("the outbox marker is set from publish_grace (store/outbox.py), not written directly")
    src = tuple(src)
    values = {**values, "status": transition(src, dst), "updated_at": now}
    values["publish_after"] = due_at(dst, now, publish_grace=publish_grace, delay=delay, waiting=waiting)
    if bump_epoch:
        values["epoch"] = runs.c.epoch + 1
    where = [runs.c.run_id == run_id, runs.c.status.in_([s.value for s in src])]
    if epoch is not None:
        where.append(runs.c.epoch == epoch)
    if extra_where is not None:
        where.append(extra_where)
    row = conn.execute(update(runs).where(*where).values(**values).returning(*runs.c)).first()
    return RunRecord.from_row(row) if row is not None else None


def position(record: RunRecord) -> dict[str, int]:
    """Where a logged event happened in the run (its message count and epoch after the move):
    what `events.derive` orders the run's status events by."""
    return {"n_messages": record.n_messages, "epoch": record.epoch}


def error_values(error: dict[str, str], system_message: str | None) -> dict[str, Any]:
    """What a move to ERROR writes besides the status: the error, clipped to its columns, the
    lease released, and the rendered system message unless one is stored already."""
    values: dict[str, Any] = dict(
        error_type=clip(error.get("type", "Error"), ERROR_TYPE_MAX),
        error_message=clip(error.get("message", ""), ERROR_MESSAGE_MAX),
        lease_owner=None,
        lease_expires_at=None,
    )
    if system_message is not None:
        values["system_message"] = func.coalesce(runs.c.system_message, system_message)
    return values


def mark_due(conn: Connection, run_id: str, *, epoch: int, now: float, publish_grace: float | None) -> bool:
    """Set a QUEUED run's outbox marker again (not a move); whether the run was QUEUED at `epoch`."""
    result = conn.execute(
        update(runs)
        .where(runs.c.run_id == run_id, runs.c.epoch == epoch, runs.c.status == S.QUEUED.value)
        .values(publish_after=due_at(S.QUEUED, now, publish_grace=publish_grace))
    )
    return bool(result.rowcount)


def count_tool_result(conn: Connection, claim: Claim, now: float) -> int | None:
    """Count one more message on the claimed run while the claim holds; the run's new message
    count, or None when the claim is lost."""
    row = conn.execute(
        update(runs)
        .where(
            runs.c.run_id == claim.run_id,
            runs.c.epoch == claim.epoch,
            runs.c.status == S.RUNNING.value,
            held(claim, now),
        )
        .values(n_messages=runs.c.n_messages + 1, updated_at=now)
        .returning(runs.c.n_messages)
    ).first()
    return None if row is None else int(row.n_messages)


def record_tool_start(conn: Connection, claim: Claim, tool_call_id: str, tool_name: str, now: float) -> bool:
    """Insert the start of an at-most-once call while the claim holds; False when it is lost."""
    found = conn.execute(
        select(runs.c.run_id)
        .where(
            runs.c.run_id == claim.run_id,
            runs.c.epoch == claim.epoch,
            runs.c.status == S.RUNNING.value,
            held(claim, now),
        )
        # Locked until the start row commits, so no claim can take the run in between and miss
        # the start (SQLite: BEGIN IMMEDIATE already serialises the two).
        .with_for_update()
    ).first()
    if found is None:
        return False
    conn.execute(
        insert(tool_starts).values(
            run_id=claim.run_id, tool_call_id=tool_call_id, tool_name=tool_name, epoch=claim.epoch, started_at=now
        )
    )
    return True


def set_kind(conn: Connection, claim: Claim, kind: str) -> None:
    """Record the claimed run's kind (agent or team), if the claim is still the holder's."""
    conn.execute(
        update(runs)
        .where(
            runs.c.run_id == claim.run_id, runs.c.epoch == claim.epoch, runs.c.lease_owner == claim.record.lease_owner
        )
        .values(kind=kind)
    )


def renew_leases(
    conn: Connection, steps: Sequence[tuple[str, int, str]], *, now: float, lease_seconds: float
) -> set[str]:
    """Extend the live leases of `steps` as (run_id, epoch, owner) in one UPDATE; the owners renewed.
    An expired lease is not revived: the sweeper may be taking the run back at this very moment."""
    statement = (
        update(runs)
        .where(
            runs.c.status == S.RUNNING.value,
            runs.c.lease_expires_at > now,
            tuple_(runs.c.run_id, runs.c.epoch, runs.c.lease_owner).in_(list(steps)),
        )
        .values(lease_expires_at=now + lease_seconds)
        .returning(runs.c.lease_owner)
    )
    return {r.lease_owner for r in conn.execute(statement)}
