"""Helpers of the producer tests: end a run through the store, as a worker's step would, so a
test can continue or cancel a run in a known status without running a model."""

from __future__ import annotations

from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus
from orchestrator.store import Store


def complete(store: Store, run_id: str, answer: str = "done") -> RunRecord:
    """Claim the run's first step and commit a final answer: the run is COMPLETED."""
    record = store.get_record(run_id)
    claim = store.claim(run_id, record.seq, record.next_step or "model", owner="test", lease_seconds=30)
    assert claim is not None, f"run {run_id} could not be claimed ({record.status})"
    return store.commit_step(
        claim, [Message(role="assistant", content=answer)], status=RunStatus.COMPLETED, next_step=None,
        publish_grace=30, content=answer,
    )  # fmt: skip


def fail(store: Store, run_id: str) -> RunRecord:
    """Claim the run's first step and fail it: the run is in ERROR, and continue resumes it."""
    record = store.get_record(run_id)
    claim = store.claim(run_id, record.seq, record.next_step or "model", owner="test", lease_seconds=30)
    assert claim is not None, f"run {run_id} could not be claimed ({record.status})"
    failed = store.fail(run_id, epoch=claim.epoch, error={"type": "Boom", "message": "the step failed"})
    assert failed is not None
    return failed
