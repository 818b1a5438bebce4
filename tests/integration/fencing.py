"""Waiting for a step that lost its run (cancelled, failed by someone else) to try to commit.

A check that the late commit was fenced means something only once that commit was attempted:
right after the cancel, the step is still in flight and the run looks right whether or not the
fence works."""

from __future__ import annotations

from typing import Any

from orchestrator.run import RunRecord
from orchestrator.store import Store
from orchestrator.testing.waiting import wait_until


def wait_for_late_commit(store: Store, left: RunRecord, *, timeout: float = 20) -> list[dict[str, Any]]:
    """Wait until the step in flight on `left.run_id` has tried to commit, and return the run's
    events: a `fenced` event (its commit was dropped) or any move of the run since `left`, the
    run as the test left it (a commit that got through, which the test then reports)."""

    def attempted() -> list[dict[str, Any]] | None:
        events = store.get_events(left.run_id)
        if any(e["kind"] == "fenced" for e in events):
            return events
        now = store.get_record(left.run_id)
        moved = (now.status, now.epoch, now.seq, now.n_messages) != (left.status, left.epoch, left.seq, left.n_messages)
        return events if moved else None

    return wait_until(attempted, timeout=timeout, what=f"the step in flight on run {left.run_id} to try to commit")


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["kind"] for e in events]
