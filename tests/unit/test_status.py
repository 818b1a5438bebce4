"""The run state machine: one table of legal moves."""

from __future__ import annotations

import pytest

from orchestrator.status import FINAL, TRANSITIONS, RunStatus, can_move


def test_every_status_has_a_row_in_the_transition_table() -> None:
    assert set(TRANSITIONS) == set(RunStatus)


def test_completed_and_cancelled_are_terminal() -> None:
    assert TRANSITIONS[RunStatus.COMPLETED] == frozenset()
    assert TRANSITIONS[RunStatus.CANCELLED] == frozenset()


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        ("QUEUED", "RUNNING"),
        ("RUNNING", "QUEUED"),
        ("RUNNING", "COMPLETED"),
        ("RUNNING", "ERROR"),
        ("RUNNING", "WAITING"),
        ("WAITING", "QUEUED"),
        ("ERROR", "QUEUED"),
        ("ERROR", "CANCELLED"),
    ],
)
def test_the_moves_the_step_protocol_needs_are_legal(src: str, dst: str) -> None:
    assert can_move(RunStatus(src), RunStatus(dst))


@pytest.mark.parametrize(
    ("src", "dst"),
    [("COMPLETED", "QUEUED"), ("CANCELLED", "QUEUED"), ("QUEUED", "COMPLETED"), ("ERROR", "RUNNING")],
)
def test_moves_that_would_resurrect_or_skip_a_claim_are_illegal(src: str, dst: str) -> None:
    assert not can_move(RunStatus(src), RunStatus(dst))


def test_wait_returns_on_exactly_the_statuses_that_need_someone_to_act() -> None:
    assert {s.value for s in FINAL} == {"COMPLETED", "ERROR", "CANCELLED", "PAUSED"}
    assert not RunStatus.WAITING.is_final and not RunStatus.QUEUED.is_final


def test_a_run_pauses_from_its_tool_step_and_a_team_from_waiting_and_only_decisions_or_a_cancel_end_it() -> None:
    # A tool batch pauses its run (RUNNING); a member's pause pauses its team (WAITING).
    assert [src for src, dsts in TRANSITIONS.items() if RunStatus.PAUSED in dsts] == [
        RunStatus.RUNNING,
        RunStatus.WAITING,
    ]
    # The last decision queues the run (a team goes back to WAITING); a deadline's "error"; a cancel.
    assert TRANSITIONS[RunStatus.PAUSED] == {RunStatus.QUEUED, RunStatus.WAITING, RunStatus.ERROR, RunStatus.CANCELLED}
