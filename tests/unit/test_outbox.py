"""The outbox marker: when the sweeper publishes a QUEUED run's step if no worker claimed it."""

from __future__ import annotations

import pytest

from orchestrator.status import RunStatus
from orchestrator.store.outbox import due_at

NOW = 1000.0


def test_a_step_its_writer_publishes_is_due_for_the_sweeper_only_after_the_grace() -> None:
    assert due_at(RunStatus.QUEUED, NOW, publish_grace=30) == NOW + 30


def test_a_step_its_writer_does_not_publish_is_due_at_once() -> None:
    assert due_at(RunStatus.QUEUED, NOW, publish_grace=None) == NOW


def test_a_retry_counts_its_grace_from_the_end_of_its_backoff() -> None:
    assert due_at(RunStatus.QUEUED, NOW, publish_grace=30, delay=5) == NOW + 35
    assert due_at(RunStatus.QUEUED, NOW, publish_grace=None, delay=600) == NOW + 600


@pytest.mark.parametrize("status", [s for s in RunStatus if s != RunStatus.QUEUED])
def test_a_run_in_any_other_status_has_no_step_to_publish(status: RunStatus) -> None:
    assert due_at(status, NOW, publish_grace=30) is None


def test_a_run_waiting_for_its_turn_in_its_session_has_no_marker_the_sweeper_would_publish() -> None:
    assert due_at(RunStatus.QUEUED, NOW, publish_grace=30, waiting=True) is None
    assert due_at(RunStatus.QUEUED, NOW, publish_grace=None, delay=5, waiting=True) is None
