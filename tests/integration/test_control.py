"""Run control on its own: what start, continue, fork and cancel write to a real store (a SQLite
file) and which steps they publish, through a dispatcher that records them. No worker runs: the
tests put runs in the status they need through the store, as a worker's step would."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Client, RunStatus, routing
from orchestrator.control import RunControl
from orchestrator.delegation import fan_in_now
from orchestrator.errors import (
    BrokerUnavailableError,
    InvalidInputError,
    RunBusyError,
    RunConflictError,
    RunNotContinuableError,
    RunNotFoundError,
)
from orchestrator.ports import StepRef
from orchestrator.settings import Settings
from orchestrator.store import Store, forget_stores
from tests.integration.producing import complete, fail, waiting_team
from tests.support import RecordingDispatcher, new_run

S = RunStatus


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    yield Store.open(f"sqlite:///{tmp_path / 'ratchet.db'}")
    forget_stores()


@pytest.fixture
def broker() -> RecordingDispatcher:
    return RecordingDispatcher()


@pytest.fixture
def control(store: Store, broker: RecordingDispatcher) -> RunControl:
    return RunControl(store, Settings(database_url=str(store.engine.url)), dispatcher=broker)


def step_of(store: Store, run_id: str) -> StepRef:
    return routing.step_of(store.get_record(run_id))


def test_a_start_publishes_its_first_step_once_and_the_same_start_again_publishes_nothing(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    assert control.start("writer", input="hi", session_id="s-1", run_id="r-1") == "r-1"
    assert control.start("writer", input="hi", session_id="s-1", run_id="r-1") == "r-1"
    assert control.start("writer", input="hi", run_id="r-1") == "r-1"

    assert store.get_record("r-1").status == S.QUEUED
    # This process does not define "writer": its step goes unrouted, for a worker to route.
    assert broker.steps == [StepRef(run_id="r-1", seq=0, kind="model", routed=False)]
    with pytest.raises(RunConflictError):
        control.start("editor", input="hi", run_id="r-1")
    with pytest.raises(RunConflictError):
        control.start("writer", input="hi", session_id="s-2", run_id="r-1")


def test_a_start_with_invalid_input_writes_and_publishes_nothing(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    with pytest.raises(InvalidInputError):
        control.start("writer", input="nul\x00", run_id="r-bad")
    with pytest.raises(RunNotFoundError):
        store.get_record("r-bad")
    assert broker.steps == []


def test_a_start_the_broker_refuses_is_saved_due_at_once_and_the_error_names_the_run(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    broker.down = True
    with pytest.raises(BrokerUnavailableError) as refused:
        control.start("writer", input="hi", run_id="r-down")

    assert refused.value.run_id == "r-down"
    record = store.get_record("r-down")
    assert record.status == S.QUEUED
    assert record.publish_after is not None and record.publish_after <= store.clock()


def test_continuing_a_failed_run_resumes_it_in_place_and_a_second_continue_changes_nothing(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    run_id = new_run(store)
    failed = fail(store, run_id)

    assert control.continue_run(run_id) == run_id
    assert control.continue_run(run_id) == run_id  # QUEUED already: going

    resumed = store.get_record(run_id)
    assert (resumed.status, resumed.seq, resumed.error_type) == (S.QUEUED, failed.seq + 1, None)
    assert broker.steps == [
        StepRef(run_id=run_id, seq=failed.seq + 1, kind="model", routed=False, trace_context=resumed.trace_context)
    ]
    with pytest.raises(RunBusyError):
        control.continue_run(run_id, input="more")


def test_continuing_a_completed_run_forks_once_per_request_and_a_fork_key_forks_again(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    run_id = new_run(store, text="first")
    complete(store, run_id, "answer")

    fork = control.continue_run(run_id, input="more")
    assert control.continue_run(run_id, input="more") == fork
    other = control.continue_run(run_id, input="more", fork_key="try-2")

    assert len({run_id, fork, other}) == 3
    assert store.get_record(fork).forked_from == run_id
    assert [m.content for m in store.get_messages(fork)] == ["first", "answer", "more"]
    assert broker.steps == [step_of(store, fork), step_of(store, other)]


def test_a_cancelled_run_stays_cancelled_and_a_completed_one_cannot_be_cancelled(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    cancelled, completed = new_run(store), new_run(store)
    complete(store, completed)

    assert control.cancel(cancelled).status == S.CANCELLED
    assert control.cancel(cancelled).status == S.CANCELLED
    with pytest.raises(RunNotContinuableError):
        control.continue_run(cancelled)
    with pytest.raises(RunNotContinuableError):
        control.cancel(completed)
    assert broker.steps == []


def test_continuing_a_team_whose_member_failed_continues_that_member_then_the_leader(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    # Given a team whose first member completed and whose second failed, which failed the team
    team_id, (done, failed) = waiting_team(store, 2)
    complete(store, done, "first answer")
    fail(store, failed)
    assert fan_in_now(store, team_id, publish_grace=30) is not None
    assert store.get_record(team_id).status == S.ERROR

    # When the team is continued
    assert control.continue_run(team_id) == team_id

    # Then the failed member resumes in place, the team waits for it, the finished one is kept
    assert store.get_record(team_id).status == S.WAITING
    assert [store.get_record(r).status for r in (done, failed)] == [S.COMPLETED, S.QUEUED]
    assert broker.steps == [step_of(store, failed)]
    # and once that member completes, the leader gets both answers
    complete(store, failed, "second answer")
    woken = fan_in_now(store, team_id, publish_grace=30)
    assert woken is not None and woken.status == S.QUEUED
    results = [m.content for m in store.get_messages(team_id) if m.role == "tool"]
    assert results == ["first answer", "second answer"]


def test_a_member_cancelled_on_its_own_hands_its_team_a_tool_error_and_wakes_the_leader(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    team_id, (member,) = waiting_team(store, 1)

    assert control.cancel(member).status == S.CANCELLED

    team = store.get_record(team_id)
    assert team.status == S.QUEUED
    last = store.get_messages(team_id)[-1]
    assert last.role == "tool" and last.tool_call_error and "cancelled" in (last.content or "")
    assert broker.steps == [routing.step_of(team)]


def test_a_leader_step_the_broker_refuses_after_a_member_cancel_is_left_to_the_sweeper(
    control: RunControl, store: Store, broker: RecordingDispatcher
) -> None:
    team_id, (member,) = waiting_team(store, 1)
    broker.down = True

    assert control.cancel(member).status == S.CANCELLED  # the cancel happened: no error

    team = store.get_record(team_id)
    assert team.status == S.QUEUED and team.publish_after is not None


def test_a_client_hands_its_writes_to_the_run_control_over_its_own_store_and_dispatcher(
    store: Store, broker: RecordingDispatcher
) -> None:
    client = Client(Settings(database_url=str(store.engine.url)), store=store, dispatcher=broker)

    handle = client.start("writer", input="hi", run_id="r-client")

    assert (handle.run_id, client.control.store, client.control.dispatcher) == ("r-client", store, broker)
    assert broker.steps == [step_of(store, "r-client")]
