"""A continue that races another writer, on SQLite and PostgreSQL: another continue, a cancel, a
prune, the run's own worker. The interleaving is made certain: the competing write runs inside
the continue, between its read of the run and its guarded move (or just after the move). The rule
each test checks: a continue that answers success leaves its run stored and going, with its
input; one that cannot, raises, and adds nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orchestrator import RunStatus
from orchestrator.control import RunControl, derived_run_id
from orchestrator.delegation import fan_in_now
from orchestrator.errors import RunBusyError, RunNotContinuableError, RunNotFoundError
from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.store import Store, forget_stores
from orchestrator.store.retention import prune
from tests.integration.producing import complete, fail, waiting_team
from tests.support import RecordingDispatcher, new_run

S = RunStatus


class RacingStore(Store):
    """The real store, running `before` once just before the first guarded move a continue makes
    (the move logged as "continue"), `after` once just after it committed, and `reading` once
    before the first read of a transcript."""

    def __init__(self, store: Store) -> None:
        super().__init__(store.engine)
        self.before: Callable[[], object] | None = None
        self.after: Callable[[], object] | None = None
        self.reading: Callable[[], object] | None = None

    def get_messages(self, run_id: str, conn: Any = None) -> list[Message]:
        reading, self.reading = self.reading, None
        if reading is not None:
            reading()
        return super().get_messages(run_id, conn)

    def move(self, run_id: str, **kwargs: Any) -> RunRecord | None:
        if kwargs.get("event") != "continue" or kwargs.get("conn") is not None:
            return super().move(run_id, **kwargs)
        before, self.before = self.before, None
        if before is not None:
            before()
        moved = super().move(run_id, **kwargs)
        after, self.after = self.after, None
        if after is not None:
            after()
        return moved


@pytest.fixture
def store(db_url: str) -> Iterator[RacingStore]:
    yield RacingStore(Store.open(db_url))
    forget_stores()


@pytest.fixture
def broker() -> RecordingDispatcher:
    return RecordingDispatcher()


def control_of(store: Store, broker: RecordingDispatcher) -> RunControl:
    return RunControl(store, Settings(database_url=str(store.engine.url)), dispatcher=broker)


@pytest.fixture
def control(store: RacingStore, broker: RecordingDispatcher) -> RunControl:
    return control_of(store, broker)


@pytest.fixture
def other(store: RacingStore) -> RunControl:
    """Another producer's run control on the same database (its steps are not this test's)."""
    return control_of(Store(store.engine), RecordingDispatcher())


def prune_all(store: Store) -> int:
    """A prune of every stopped run (the cut is in the future): how many runs it deleted."""
    return prune(Store(store.engine), cutoff=time.time() + 60).runs


def failed_run(store: Store) -> str:
    run_id = new_run(store, text="first")
    fail(store, run_id)
    return run_id


def test_a_continue_that_loses_to_a_prune_is_run_not_found_and_publishes_nothing(
    control: RunControl, store: RacingStore, broker: RecordingDispatcher
) -> None:
    # Given a failed run, pruned after the continue read it and before its move
    run_id = failed_run(store)
    store.before = lambda: prune_all(store)

    # When it is continued, Then the continue says the run is gone
    with pytest.raises(RunNotFoundError):
        control.continue_run(run_id, input="more")
    assert broker.steps == []


def test_a_continue_that_moves_before_a_prune_keeps_its_run_and_its_input(
    control: RunControl, store: RacingStore, broker: RecordingDispatcher
) -> None:
    # Given a failed run that a prune meets just after the continue's move
    run_id = failed_run(store)
    pruned: list[int] = []
    store.after = lambda: pruned.append(prune_all(store))

    # When it is continued with input
    assert control.continue_run(run_id, input="more") == run_id

    # Then the prune passed over it: it is QUEUED with the input, and its step went out
    assert pruned == [0]
    assert store.get_record(run_id).status == S.QUEUED
    assert [m.content for m in store.get_messages(run_id)][-1] == "more"
    assert [s.run_id for s in broker.steps] == [run_id]


def test_a_fork_whose_source_is_pruned_as_it_is_read_is_run_not_found_and_no_fork_is_made(
    control: RunControl, store: RacingStore, broker: RecordingDispatcher
) -> None:
    # Given a completed run, pruned after the continue read it and before it read its transcript
    run_id = new_run(store, text="first")
    complete(store, run_id, "answer")
    store.reading = lambda: prune_all(store)

    # When it is continued (a fork), Then the continue says the run is gone, and forks nothing
    with pytest.raises(RunNotFoundError, match="was deleted while this continue was forking it"):
        control.continue_run(run_id, input="more")
    assert broker.steps == []
    with pytest.raises(RunNotFoundError):
        store.get_record(derived_run_id("fork", run_id, "input", "more"))


def test_a_continue_with_input_that_loses_to_another_continue_is_refused_and_adds_nothing(
    control: RunControl, other: RunControl, store: RacingStore, broker: RecordingDispatcher
) -> None:
    run_id = failed_run(store)
    store.before = lambda: other.continue_run(run_id)

    with pytest.raises(RunBusyError, match="its input was not added: send it again once the run stops"):
        control.continue_run(run_id, input="more")

    assert "more" not in [m.content for m in store.get_messages(run_id)]
    assert [e["kind"] for e in store.get_events(run_id)].count("continue") == 1
    assert broker.steps == []


def test_a_continue_without_input_that_loses_to_another_continue_answers_as_that_one_did(
    control: RunControl, other: RunControl, store: RacingStore, broker: RecordingDispatcher
) -> None:
    run_id = failed_run(store)
    store.before = lambda: other.continue_run(run_id)

    assert control.continue_run(run_id) == run_id

    assert store.get_record(run_id).status == S.QUEUED
    assert [e["kind"] for e in store.get_events(run_id)].count("continue") == 1
    assert broker.steps == []  # the other continue published the one step


def test_a_continue_that_loses_to_a_cancel_is_refused(
    control: RunControl, other: RunControl, store: RacingStore, broker: RecordingDispatcher
) -> None:
    run_id = failed_run(store)
    store.before = lambda: other.cancel(run_id)

    with pytest.raises(RunNotContinuableError, match="was cancelled while this continue was on its way"):
        control.continue_run(run_id)
    assert store.get_record(run_id).status == S.CANCELLED and broker.steps == []


def test_a_run_that_another_continue_resumed_to_completion_is_not_forked_without_input_and_forked_with_it(
    control: RunControl, other: RunControl, store: RacingStore, broker: RecordingDispatcher
) -> None:
    # Given failed runs that another continue resumes and their worker completes, before the move
    def resumed_and_completed(run_id: str) -> Callable[[], object]:
        return lambda: (other.continue_run(run_id), complete(store, run_id, "answer"))

    quiet, talkative = failed_run(store), failed_run(store)

    # When each is continued, Then without input the answer is the run itself: nothing left to do
    store.before = resumed_and_completed(quiet)
    assert control.continue_run(quiet) == quiet
    assert broker.steps == []
    # And the input of the other goes to a fork of the completed run, not nowhere
    store.before = resumed_and_completed(talkative)
    fork = control.continue_run(talkative, input="more")
    assert fork != talkative and store.get_record(fork).forked_from == talkative
    assert [m.content for m in store.get_messages(fork)][-2:] == ["answer", "more"]
    assert [s.run_id for s in broker.steps] == [fork]


def test_a_team_continue_that_loses_to_another_continue_answers_as_that_one_did(
    control: RunControl, other: RunControl, store: RacingStore, broker: RecordingDispatcher
) -> None:
    # Given a team in ERROR because its member failed, continued by another request meanwhile
    team_id, (member,) = waiting_team(store, 1)
    fail(store, member)
    assert fan_in_now(store, team_id, publish_grace=30) is not None
    # (the first move a team's continue makes is its member's: the other request comes before it)
    store.before = lambda: other.continue_run(team_id)

    assert control.continue_run(team_id) == team_id

    assert [store.get_record(r).status for r in (team_id, member)] == [S.WAITING, S.QUEUED]
    assert [e["kind"] for e in store.get_events(team_id)].count("continue") == 1
    assert [e["kind"] for e in store.get_events(member)].count("continue") == 1


def test_continues_and_prunes_racing_on_threads_never_answer_success_for_a_run_gone_or_without_its_input(
    db_url: str,
) -> None:
    # Given failed runs, each continued with two inputs at once while prunes run
    base = Store.open(db_url)
    runs = [failed_run(base) for _ in range(12)]
    answers: dict[tuple[str, str], str | BaseException] = {}
    start = threading.Barrier(3)

    def continue_all(text: str) -> None:
        control = control_of(Store(base.engine), RecordingDispatcher())
        for run_id in runs:
            start.wait(30)
            try:
                answers[(run_id, text)] = control.continue_run(run_id, input=text)
            except (RunBusyError, RunNotFoundError) as exc:
                answers[(run_id, text)] = exc

    def prune_each() -> None:
        for _ in runs:
            start.wait(30)
            prune_all(base)

    threads = [threading.Thread(target=continue_all, args=(t,)) for t in ("one", "two")]
    threads.append(threading.Thread(target=prune_each))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    # Then every continue that answered success left its run stored, QUEUED, with its input;
    # every other one raised, and its input is nowhere
    assert len(answers) == 2 * len(runs)
    for (run_id, text), answer in answers.items():
        stored = [m.content for m in base.get_messages(run_id)]
        if isinstance(answer, str):
            assert answer == run_id and base.get_record(run_id).status == S.QUEUED and text in stored
        else:
            assert text not in stored
