"""Session state in the store, on SQLite and PostgreSQL: a change commits with the write that
carries its tool result (or writes its run) and only then; two changes of one session committed
at once both land; the failure handler's flush applies the changes of the results it stores."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from orchestrator import RunStatus
from orchestrator.errors import FencedError, RunConflictError
from orchestrator.messages import Message, ToolCall
from orchestrator.runtime import build
from orchestrator.settings import Settings
from orchestrator.state import StateChange
from orchestrator.steps import StepRunner
from orchestrator.store import Claim, Store, sessions
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.waiting import wait_until
from tests.support import Clock

S = RunStatus


@pytest.fixture
def store(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    store = Store.open(db_url)
    monkeypatch.setattr(store, "clock", Clock())
    yield store


def tool_step(store: Store, session_id: str, *call_ids: str) -> Claim:
    """A run of `session_id` claimed for a tool batch of `call_ids`."""
    run_id = str(uuid.uuid4())
    store.create_run(
        run_id=run_id, session_id=session_id, agent_name="nobody", kind="agent",
        input_messages=[Message(role="user", content="go")], publish_grace=60,
    )  # fmt: skip
    model = store.claim(run_id, 0, "model", owner="test-model", lease_seconds=30, max_attempts=5)
    assert model is not None
    calls = [ToolCall(id=c, name="tally").to_openai() for c in call_ids]
    store.commit_step(
        model, [Message(role="assistant", tool_calls=calls)], status=S.QUEUED, next_step="tools", publish_grace=60
    )
    claim = store.claim(run_id, 1, "tools", owner="test-tools", lease_seconds=30, max_attempts=5)
    assert claim is not None
    return claim


def result(call_id: str) -> Message:
    return Message(role="tool", tool_call_id=call_id, tool_name="tally", content="ok")


def test_a_result_and_its_change_commit_together_and_a_fenced_write_changes_nothing(store: Store) -> None:
    claim = tool_step(store, "s-fence", "c1", "c2", "c3")

    store.append_tool_result(claim, result("c1"), StateChange(set={"count": 1}))
    assert store.session_state("s-fence") == {"count": 1}

    store.clock.advance(31)  # type: ignore[attr-defined]  # the lease is gone: the step is fenced
    with pytest.raises(FencedError):
        store.append_tool_result(claim, result("c2"), StateChange(set={"count": 2}))
    with pytest.raises(FencedError):
        store.commit_step(
            claim, [result("c3")], status=S.QUEUED, next_step="model", publish_grace=60,
            state_changes=[StateChange(set={"count": 3})],
        )  # fmt: skip
    assert store.session_state("s-fence") == {"count": 1}
    assert [m.tool_call_id for m in store.get_messages(claim.run_id) if m.role == "tool"] == ["c1"]


def test_a_step_commit_carries_the_changes_of_its_results(store: Store) -> None:
    claim = tool_step(store, "s-commit", "c1", "c2")

    store.commit_step(
        claim, [result("c1"), result("c2")], status=S.QUEUED, next_step="model", publish_grace=60,
        state_changes=[StateChange(set={"a": 1, "gone": 0}), StateChange(set={"b": 2}, removed=("gone",))],
    )  # fmt: skip

    assert store.session_state("s-commit") == {"a": 1, "b": 2}
    assert store.get_output(claim.run_id).session_state == {"a": 1, "b": 2}


def test_two_changes_of_one_session_committed_at_once_both_land(store: Store, db_url: str) -> None:
    run = tool_step(store, "s-race", "c1").record
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        with store.engine.begin() as conn:
            sessions.apply(conn, run, [StateChange(set={"first": 1})])
            holding.set()
            release.wait(10)

    def second() -> None:
        with store.engine.begin() as conn:
            sessions.apply(conn, run, [StateChange(set={"second": 2})])

    a = threading.Thread(target=first)
    a.start()
    assert holding.wait(10)
    b = threading.Thread(target=second)
    b.start()
    if db_url.startswith("postgresql"):
        # The second has read the row, or waits to: it must wait for the first's lock, not read
        # the state from before the first's change.
        wait_until(lambda: _waiting_on_a_lock(store), 10, what="the second change to wait for the row lock")
    release.set()
    a.join(10)
    b.join(10)

    assert store.session_state("s-race") == {"first": 1, "second": 2}


def _waiting_on_a_lock(store: Store) -> bool:
    with store.engine.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        return bool(conn.execute(text(query)).scalar())


def test_the_failure_handler_stores_a_finished_calls_result_with_its_change(store: Store, db_url: str) -> None:
    claim = tool_step(store, "s-flush", "c1", "c2")
    runner = StepRunner(build(Settings(database_url=db_url), store=store))
    flight = runner.inflight.begin(claim)
    flight.messages.append(result("c1"))
    flight.state_changes["c1"] = StateChange(set={"paid": True})
    flight.state_changes["c2"] = StateChange(set={"never": True})  # its result is not in flight: not stored

    assert runner.fail_step(claim.run_id, claim.record.seq, RuntimeError("boom"), owner="test-tools")

    out = store.get_output(claim.run_id)
    assert out.status == S.ERROR and [t.tool_call_id for t in out.tools] == ["c1"]
    assert out.session_state == {"paid": True}


def test_a_runs_state_is_merged_when_it_is_written_and_not_again_by_a_repeated_start(store: Store, db_url: str) -> None:
    dispatcher = InMemoryDispatcher(Settings(database_url=db_url), store=store, autorun=False)
    client = dispatcher.client
    run_id = f"r-{uuid.uuid4().hex[:8]}"

    client.start("nobody", input="hi", session_id="s-start", run_id=run_id, user_id="ada", session_state={"a": 1})
    with store.engine.begin() as conn:  # a tool of the run changes it meanwhile
        sessions.apply(conn, store.get_record(run_id), [StateChange(set={"a": 2})])
    again = client.start(
        "nobody", input="hi", session_id="s-start", run_id=run_id, user_id="ada", session_state={"a": 1}
    )

    assert again.run_id == run_id
    run = client.get_run(run_id)
    assert run.user_id == "ada" and run.session_state == {"a": 2}
    # Another state under the run id is another request (`orchestrator.idempotency`): nothing is merged
    with pytest.raises(RunConflictError, match="started with another session_state"):
        client.start(
            "nobody", input="hi", session_id="s-start", run_id=run_id, user_id="ada", session_state={"a": 1, "b": 1}
        )
    assert client.get_run(run_id).session_state == {"a": 2}
    with pytest.raises(RunConflictError, match="is taken by another run"):
        client.start("nobody", input="hi", run_id=run_id, user_id="bob")
    other = client.start("nobody", input="hi", session_id="s-start", user_id="ada", session_state={"b": 3})
    assert client.get_run(other.run_id).session_state == {"a": 2, "b": 3}
    session = client.get_session("s-start")
    assert session is not None and session.user_id == "ada" and session.session_state == {"a": 2, "b": 3}
