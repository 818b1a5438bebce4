"""Parking a claimed step: QUEUED again, to run after a delay, without its commit. A retry after
a transient model failure (`Store.park_for_retry`), or a step a limit held back before its call
(`Store.park_throttled`, `orchestrator.limits`). Either is a guarded move of the claim's holder,
and leaves an entry in the run's log saying why and who publishes the step (a countdown, or the
sweeper once it is due)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.errors import FencedError
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import writes
from orchestrator.store.claims import Claim, held

if TYPE_CHECKING:
    from orchestrator.store.store import Store

S = RunStatus


def park(
    store: Store, claim: Claim, event: str, delay: float, published: bool, publish_grace: float,
    counts: dict[str, Any], **why: Any,
) -> RunRecord:  # fmt: skip
    """Move the claimed run RUNNING -> QUEUED (with `counts`: its seq, retries, attempts), its
    outbox marker due after `delay` (and `publish_grace` more when the caller publishes it),
    and log `event` with `why`; FencedError if the claim was lost."""
    now = store.clock()
    with store.engine.begin() as conn:
        record = store.move(
            claim.run_id, src=(S.RUNNING,), dst=S.QUEUED, epoch=claim.epoch, extra_where=held(claim, now),
            publish_grace=publish_grace if published else None, delay=delay, conn=conn,
            lease_owner=None, lease_expires_at=None, **counts,
        )  # fmt: skip
        if record is None:
            raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before the step was parked")
        store.log_event(
            conn, claim.run_id, event, record.seq, delay=round(delay, 3), **why,
            by="countdown" if published else "sweeper", **writes.position(record),
        )  # fmt: skip
        return record
