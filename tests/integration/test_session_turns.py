"""A session's runs one at a time (`serialize_session_runs=True`), on SQLite and PostgreSQL,
stepped by the in-memory dispatcher on a real store: a run's first step waits until every run of
its session started before it has stopped, so its history holds theirs; a stop gives the next one
its turn, and a turn its stopper never gave is given by the sweeper."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from orchestrator import Agent, ConfigurationError, RunStatus, Team, tool
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel

S = RunStatus
#: The scripted model's answer lists every user text it was shown, history first; it calls the
#: tool `note` once first, so that a run is under way (QUEUED for its tool step) after its first step.
SEEN = ScriptConfig(tool_batches=1, tool="note", final_text="seen: {users}", chat=True)


@tool
def note(text: str) -> str:
    """Write a note."""
    return f"noted {text}"


def chat(**options: object) -> Agent:
    tools = options.pop("tools", [note])
    return Agent(
        name=f"chat-{uuid.uuid4().hex[:8]}",
        model=ScriptedModel(script=SEEN),
        tools=tools,  # type: ignore[arg-type]
        add_history_to_context=True,
        num_history_runs=10,
        **options,  # type: ignore[arg-type]
    )


def seen(content: object) -> list[str]:
    assert isinstance(content, str) and content.startswith("seen: "), content
    return content.removeprefix("seen: ").split(" | ")


def kinds(dispatcher: InMemoryDispatcher, run_id: str) -> list[str]:
    return [e.kind for e in dispatcher.client.get_log(run_id)]


@pytest.fixture
def manual(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url, autorun=False) as dispatcher:
        yield dispatcher


def test_two_runs_started_together_take_turns_and_the_second_sees_the_first(manual: InMemoryDispatcher) -> None:
    agent = chat(serialize_session_runs=True)
    first = agent.start("first", session_id="s1")
    second = agent.start("second", session_id="s1")
    other = agent.start("elsewhere", session_id="s2")
    assert manual.run_next() is not None  # the first run's first model step: under way

    # When the second run's first step is delivered while the first is under way
    assert manual.run_next() is not None

    # Then it waits, QUEUED, holding no worker and no step the sweeper would publish
    record = manual.store.get_record(second.run_id)
    assert (record.status, record.publish_after, record.lease_owner) == (S.QUEUED, None, None)
    assert kinds(manual, second.run_id)[-1] == "session_wait"
    assert manual.sweep().republished == []
    manual.run_until_idle()
    # And once the first completed it took its turn: its history holds the first run
    assert seen(first.wait(timeout=5).content) == ["first"]
    out = second.wait(timeout=5)
    assert seen(out.content) == ["first", "second"]
    assert out.history_run_ids == [first.run_id]
    assert "session_turn" in kinds(manual, second.run_id)
    assert seen(other.wait(timeout=5).content) == ["elsewhere"]  # another session never waited
    assert "session_wait" not in kinds(manual, other.run_id)


def test_without_the_option_two_runs_started_together_choose_their_histories_apart(
    manual: InMemoryDispatcher,
) -> None:
    agent = chat()
    first = agent.start("first", session_id="s1")
    second = agent.start("second", session_id="s1")
    manual.run_until_idle()

    assert seen(first.wait(timeout=5).content) == ["first"]
    assert seen(second.wait(timeout=5).content) == ["second"]


def test_runs_go_in_the_order_they_were_started_whatever_order_their_steps_arrive_in(
    manual: InMemoryDispatcher,
) -> None:
    agent = chat(serialize_session_runs=True)
    handles = [agent.start(text, session_id="s1") for text in ("one", "two", "three", "four")]
    # The last run's step is delivered first, then the third's: each waits behind the runs before it
    for handle in reversed(handles[2:]):
        manual.runner.model_step(handle.run_id, 0, owner=f"test:1:{handle.run_id}")
        assert manual.store.get_record(handle.run_id).publish_after is None

    manual.run_until_idle()

    outs = [h.wait(timeout=5) for h in handles]
    assert [seen(o.content) for o in outs] == [
        ["one"],
        ["one", "two"],
        ["one", "two", "three"],
        ["one", "two", "three", "four"],
    ]
    # Each model call was made after the one before it had completed
    calls = [manual.store.get_output(h.run_id).messages[-1].created_at for h in handles]
    assert calls == sorted(calls)


def test_a_run_ahead_that_fails_lets_the_next_go_and_history_leaves_it_out(manual: InMemoryDispatcher) -> None:
    agent = chat(serialize_session_runs=True)
    assert isinstance(agent.model, ScriptedModel)
    kept = agent.start("kept", session_id="s1")
    manual.run_until_idle()
    failed = agent.start("failed", session_id="s1")
    after = agent.start("after", session_id="s1")
    assert manual.run_next() is not None and manual.run_next() is not None
    assert manual.store.get_record(after.run_id).publish_after is None  # waiting behind the run ahead
    # When the run ahead fails for good (its next model call: a 400)
    agent.model.script = SEEN.model_copy(update={"faults": [Fault(status=400, message="bad request")]})
    manual.run_next()  # its tool step
    manual.run_next()  # its model step: ERROR, and the run behind it is given its turn
    assert manual.store.get_record(failed.run_id).status == S.ERROR
    agent.model.script = SEEN

    manual.run_until_idle()

    assert failed.wait(timeout=5).status == S.ERROR
    assert seen(after.wait(timeout=5).content) == ["kept", "after"]  # as Agno, a failed run is no history
    assert kept.wait(timeout=5).status == S.COMPLETED


@tool(requires_confirmation=True)
def pay(amount: int) -> str:
    """Pay an amount."""
    return f"paid {amount}"


def test_a_paused_run_ahead_keeps_the_next_waiting_until_a_person_decided_and_it_completed(
    manual: InMemoryDispatcher,
) -> None:
    script = SEEN.model_copy(update={"tool_batches": 1, "tool": "pay"})
    agent = chat(serialize_session_runs=True, tools=[note, pay])
    assert isinstance(agent.model, ScriptedModel)
    agent.model.script = script
    paying = agent.start("pay", session_id="s1")
    manual.run_until_idle()
    assert paying.wait(timeout=5).status == S.PAUSED
    agent.model.script = SEEN
    asking = agent.start("did it go through?", session_id="s1")
    manual.run_until_idle()
    assert manual.store.get_record(asking.run_id).status == S.QUEUED  # waits behind the paused run

    paused = manual.client.get_run(paying.run_id)
    for requirement in paused.active_requirements:
        requirement.confirm()
    manual.client.continue_run(paying.run_id, requirements=paused.active_requirements)
    manual.run_until_idle()

    assert paying.wait(timeout=5).status == S.COMPLETED
    assert seen(asking.wait(timeout=5).content) == ["pay", "did it go through?"]


def test_cancelling_the_run_ahead_or_a_waiting_run_lets_the_next_one_go(manual: InMemoryDispatcher) -> None:
    agent = chat(serialize_session_runs=True)
    ahead = agent.start("ahead", session_id="s1")
    middle = agent.start("middle", session_id="s1")
    last = agent.start("last", session_id="s1")
    assert manual.run_next() is not None  # the first is under way
    assert manual.run_next() is not None and manual.run_next() is not None  # the others wait
    assert [manual.store.get_record(h.run_id).publish_after for h in (middle, last)] == [None, None]

    # When the waiting middle run is cancelled, the last still waits for the first
    manual.client.cancel(middle.run_id)
    assert manual.store.get_record(last.run_id).publish_after is None
    # And when the first is cancelled as it runs, the last one goes
    manual.client.cancel(ahead.run_id)
    assert manual.store.get_record(last.run_id).publish_after is not None
    manual.run_until_idle()

    assert seen(last.wait(timeout=5).content) == ["last"]
    assert {manual.store.get_record(h.run_id).status for h in (ahead, middle)} == {S.CANCELLED}


def test_a_stop_whose_waker_died_before_it_woke_the_session_is_followed_by_the_sweepers_turn(
    manual: InMemoryDispatcher,
) -> None:
    agent = chat(serialize_session_runs=True)
    ahead = agent.start("ahead", session_id="s1")
    behind = agent.start("behind", session_id="s1")
    assert manual.run_next() is not None and manual.run_next() is not None
    assert manual.store.get_record(ahead.run_id).wakes_session is True
    # Given the run ahead stopped by a write whose process died before it gave the turn (the
    # store's cancel alone: the move commits, nothing after it runs)
    stopped = manual.store.endings.cancel(manual.store.get_record(ahead.run_id))
    assert stopped is not None and stopped.wakes_session is True
    manual.run_until_idle()  # the run ahead's step is stale: dropped
    assert manual.store.get_record(behind.run_id).publish_after is None

    # When the sweeper passes
    report = manual.sweep()

    # Then the run behind takes its turn, and the stopped run is no longer marked
    assert report.turns == [behind.run_id]
    manual.run_until_idle()
    assert seen(behind.wait(timeout=5).content) == ["behind"]
    assert manual.store.get_record(ahead.run_id).wakes_session is None
    assert manual.sweep().turns == []


def test_a_run_written_late_goes_after_a_later_run_already_under_way(
    manual: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = chat(serialize_session_runs=True)
    early = agent.start("early", session_id="s1")
    assert manual.run_next() is not None  # its first step: under way (its tool step queued)
    started = manual.store.get_record(early.run_id).created_at
    # Given a run started before it by its producer's clock, whose row is written only now (a
    # producer slow between reading its clock and its commit)
    store_clock = manual.store.clock
    monkeypatch.setattr(manual.store, "clock", lambda: started - 1.0)
    late = agent.start("late", session_id="s1")
    monkeypatch.setattr(manual.store, "clock", store_clock)
    assert manual.store.get_record(late.run_id).created_at < started

    manual.run_until_idle()

    # Then it waited for the run already under way: never two at once
    assert seen(early.wait(timeout=5).content) == ["early"]
    assert seen(late.wait(timeout=5).content) == ["early", "late"]
    assert "session_wait" in kinds(manual, late.run_id)


def test_a_team_takes_turns_too_and_its_members_never_wait(manual: InMemoryDispatcher) -> None:
    member = Agent(name=f"member-{uuid.uuid4().hex[:8]}", role="answers", model=ScriptedModel(script=SEEN))
    from orchestrator.team import TO_MEMBER, member_id

    leader = ScriptConfig(
        batches=[[{"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "answer it"}}]],
        final_text="team saw: {users}",
        chat=True,
    )
    team = Team(
        name=f"team-{uuid.uuid4().hex[:8]}",
        model=ScriptedModel(script=leader),
        members=[member],
        add_history_to_context=True,
        serialize_session_runs=True,
    )
    first = team.start("first", session_id="s1")
    second = team.start("second", session_id="s1")
    manual.run_until_idle()

    assert first.wait(timeout=5).status == S.COMPLETED
    out = second.wait(timeout=5)
    assert out.history_run_ids == [first.run_id]
    assert "session_wait" in kinds(manual, second.run_id)


def test_a_run_of_another_agent_in_the_session_counts_ahead_too(manual: InMemoryDispatcher) -> None:
    other = chat()  # not serialized itself: it never waits
    serial = chat(serialize_session_runs=True)
    ahead = other.start("other agent", session_id="s1")
    assert manual.run_next() is not None  # under way
    behind = serial.start("serial agent", session_id="s1")
    assert manual.run_next() is not None  # the other's tool step
    assert manual.run_next() is not None  # the serialized run's first step: it waits
    assert manual.store.get_record(behind.run_id).publish_after is None

    manual.run_until_idle()

    assert ahead.wait(timeout=5).status == S.COMPLETED
    assert seen(behind.wait(timeout=5).content) == ["serial agent"]  # history is its own agent's
    assert "session_wait" in kinds(manual, behind.run_id)


def test_the_option_is_a_yes_or_no() -> None:
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigurationError, match="serialize_session_runs must be True or False"):
            chat(serialize_session_runs=bad)
