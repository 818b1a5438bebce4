"""Run events derived from the store's rows, on SQLite and PostgreSQL: runs stepped by the in-memory
dispatcher (real SQLite or PostgreSQL, the `ratchet_deltas` table for deltas) and by a real
worker (Redis broker, so deltas go through a Redis stream). Every event comes in id order, a
reader that resumes after an id gets exactly the rest, and a streamed run's deltas add up to the
content it committed."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from orchestrator import Agent, Client, InvalidInputError, RunNotFoundError, RunStatus, Team
from orchestrator.events import MAX_PART, RunEvent, drop_restarted, parse_id
from orchestrator.reader import durable_events
from orchestrator.settings import Settings
from orchestrator.steps.live import LiveStep
from orchestrator.store.tables import deltas
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.support import Clock
from workers.redis.delta_sink import KEY

S = RunStatus


def name() -> str:
    return f"ev-{uuid.uuid4().hex[:8]}"


def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def boom(q: str) -> str:
    """Always fails."""
    raise ValueError("no luck")


def tool_agent(**script: object) -> Agent:
    config = ScriptConfig(
        batches=[[{"tool": "lookup", "arguments": {"q": "otters"}}, {"tool": "boom", "arguments": {"q": "x"}}]],
        final_text="Otters are {tool_results} indeed",
        **script,  # type: ignore[arg-type]
    )
    return Agent(name=name(), model=ScriptedModel(script=config), tools=[lookup, boom])


def kinds(events: list[RunEvent]) -> list[str]:
    return [e.event for e in events]


def text_of(events: list[RunEvent]) -> str:
    return "".join(e.content or "" for e in drop_restarted(events) if e.event == "RunContent")


def assert_in_id_order(events: list[RunEvent]) -> None:
    keys = [parse_id(e.id) for e in events]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


@pytest.fixture
def inline(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url) as dispatcher:
        yield dispatcher


# ---------------------------------------------------------------- durable events


def test_a_tool_calling_run_yields_its_start_its_tool_calls_with_the_error_flag_and_its_completion(
    inline: InMemoryDispatcher,
) -> None:
    out = tool_agent().run("tell me about otters")
    assert out.status == S.COMPLETED

    events = list(inline.client.stream(out.run_id))

    assert kinds(events) == [
        "RunStarted", "ToolCallStarted", "ToolCallStarted", "ToolCallCompleted", "ToolCallCompleted", "RunCompleted",
    ]  # fmt: skip
    assert_in_id_order(events)
    started = [e.tool for e in events if e.event == "ToolCallStarted"]
    assert [(t.tool_name, t.tool_args) for t in started if t] == [("lookup", {"q": "otters"}), ("boom", {"q": "x"})]
    done = [e.tool for e in events if e.event == "ToolCallCompleted"]
    assert [(t.tool_name, t.tool_call_error) for t in done if t] == [("lookup", False), ("boom", True)]
    assert done[0] is not None and done[0].result == "found otters"
    assert events[-1].content == out.content and events[-1].status == "COMPLETED"
    assert {e.run_id for e in events} == {out.run_id}
    # Nothing of a run that was not streamed is written as a live event.
    with inline.store.quick_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(deltas)).scalar() == 0


def test_a_run_that_fails_yields_run_error_and_one_continued_yields_run_continued_then_the_rest(
    inline: InMemoryDispatcher,
) -> None:
    agent = Agent(name=name(), model=ScriptedModel(script=ScriptConfig(faults=[Fault(status=400, times=1)])))
    failed = agent.run("hello")
    assert failed.status == S.ERROR

    events = list(inline.client.stream(failed.run_id))
    assert kinds(events) == ["RunStarted", "RunError"]
    assert events[-1].error is not None and events[-1].error.type == failed.error.type  # type: ignore[union-attr]

    inline.client.continue_run(failed.run_id).wait(10)
    resumed = list(inline.client.stream(failed.run_id))
    assert kinds(resumed) == ["RunStarted", "RunError", "RunContinued", "RunCompleted"]
    assert resumed[:2] == events  # what happened before keeps its ids
    assert_in_id_order(resumed)


def test_a_cancelled_run_yields_run_cancelled(db_url: str) -> None:
    with in_memory(db_url, autorun=False) as inline:
        handle = inline.client.start(Agent(name=name(), model=ScriptedModel()).name, input="hello")
        inline.client.cancel(handle.run_id)

        events = list(inline.client.stream(handle.run_id))

    assert kinds(events) == ["RunStarted", "RunCancelled"]
    assert events[-1].status == "CANCELLED"


def test_a_team_yields_its_members_starts_and_completions_between_its_delegation_call_and_its_answer(
    inline: InMemoryDispatcher,
) -> None:
    member = Agent(name=name(), model=ScriptedModel(script=ScriptConfig(final_text="member says hi")), role="Helps.")
    delegate = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "say hi"}}
    leader = ScriptedModel(script=ScriptConfig(batches=[[delegate]], final_text="team done"))
    team = Team(name=name(), model=leader, members=[member], instructions="Delegate.")

    out = team.run("go")
    assert out.status == S.COMPLETED

    events = list(inline.client.stream(out.run_id))
    assert kinds(events) == [
        "RunStarted", "ToolCallStarted", "MemberRunStarted", "MemberRunCompleted", "ToolCallCompleted", "RunCompleted",
    ]  # fmt: skip
    assert_in_id_order(events)
    started, completed = events[2], events[3]
    assert started.member_run_id == completed.member_run_id == out.member_runs[0].run_id
    assert completed.member_agent == member.name and completed.content == "member says hi"


def test_a_streamed_teams_members_are_streamed_and_a_reader_follows_one_by_the_id_its_start_event_names(
    inline: InMemoryDispatcher,
) -> None:
    member = Agent(name=name(), model=ScriptedModel(script=ScriptConfig(final_text="member says hi")), role="Helps.")
    delegate = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "say hi"}}
    leader = ScriptedModel(script=ScriptConfig(batches=[[delegate]], final_text="team done"))
    team = Team(name=name(), model=leader, members=[member], instructions="Delegate.")

    events = list(team.run("go", stream=True))

    assert text_of(events) == "team done"
    started = next(e for e in events if e.event == "MemberRunStarted")
    assert started.member_run_id is not None
    of_member = list(inline.client.stream(started.member_run_id))
    assert kinds(of_member)[0] == "RunStarted" and kinds(of_member)[-1] == "RunCompleted"
    assert text_of(of_member) == "member says hi"


# ---------------------------------------------------------------- streamed runs


def test_a_streamed_runs_deltas_add_up_to_its_content_and_a_reader_resumes_after_any_id_without_gap_or_duplicate(
    inline: InMemoryDispatcher,
) -> None:
    agent = tool_agent()
    # The in-memory dispatcher runs every step before start() returns: this reader comes late.
    events = list(agent.run("tell me about otters", stream=True))

    run = inline.client.get_run(events[0].run_id)
    assert run.status == S.COMPLETED
    assert kinds(events)[0] == "RunStarted" and kinds(events)[-1] == "RunCompleted"
    assert "RunContent" in kinds(events)
    assert text_of(events) == run.content == events[-1].content
    assert_in_id_order(events)
    for i, event in enumerate(events):
        assert list(inline.client.stream(run.run_id, after=event.id)) == events[i + 1 :]
    # The durable events alone are what a run not streamed would show.
    assert [e for e in events if e.event != "RunContent"] == durable_events(inline.store, run.run_id)[1]


def test_a_retried_call_of_a_streamed_run_says_step_restarted_after_its_retry(inline: InMemoryDispatcher) -> None:
    config = ScriptConfig(final_text="second time lucky", faults=[Fault(status=500, times=1)])
    agent = Agent(name=name(), model=ScriptedModel(script=config), retries=2)

    events = list(agent.run("hello", stream=True))

    assert kinds(events)[:3] == ["RunStarted", "RunRetrying", "StepRestarted"]
    assert kinds(events)[-1] == "RunCompleted"
    assert text_of(events) == "second time lucky"
    assert_in_id_order(events)


def test_a_step_recovered_after_its_worker_died_mid_reply_says_step_restarted_and_its_text_replaces_the_partial_one(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(inline.store, "clock", clock)
    agent = Agent(name=name(), model=ScriptedModel(script=ScriptConfig(final_text="the whole reply")))
    inline.autorun = False
    run_id = inline.client.start(agent.name, input="hello", stream=True).run_id
    # A worker claimed the model step, streamed part of its reply, and died.
    doomed = inline.store.claim(run_id, 0, "model", owner="doomed", lease_seconds=30, max_attempts=5)
    assert doomed is not None
    partial = LiveStep(inline.runtime.deltas, doomed, clock)
    partial.delta("the wh")
    inline.run_until_idle()  # the step's own delivery: dropped, the claim is held
    clock.advance(31)  # its lease expires; the sweeper takes the step back
    assert inline.sweep().requeued == [run_id]
    inline.run_until_idle()

    events = list(inline.client.stream(run_id))

    assert kinds(events)[:4] == ["RunStarted", "RunContent", "StepRestarted", "RunContent"]
    assert events[1].content == "the wh" and events[2].attempt == events[3].attempt > events[1].attempt  # type: ignore[operator]
    assert text_of(events) == "the whole reply" == inline.client.get_run(run_id).content
    assert_in_id_order(events)


def test_arun_with_stream_returns_an_async_iterator_of_the_runs_events(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name(), model=ScriptedModel(script=ScriptConfig(final_text="async words flow")))

    async def read() -> list[RunEvent]:
        return [e async for e in await agent.arun("hello", stream=True)]

    events = asyncio.run(read())

    assert kinds(events)[0] == "RunStarted" and kinds(events)[-1] == "RunCompleted"
    assert text_of(events) == "async words flow"


def test_streaming_an_unknown_run_or_after_a_malformed_id_fails_when_asked_not_when_read(
    inline: InMemoryDispatcher,
) -> None:
    with pytest.raises(RunNotFoundError):
        inline.client.stream("no-such-run")
    run = Agent(name=name(), model=ScriptedModel()).run("hello")
    with pytest.raises(InvalidInputError, match="event id 'last'"):
        inline.client.astream(run.run_id, after="last")


# ---------------------------------------------------------------- on a real worker


def slow_lookup(q: str) -> str:
    """Look something up, slowly."""
    time.sleep(0.3)
    return f"found {q}"


@pytest.mark.usefixtures("worker")
def test_two_live_readers_of_a_streamed_run_on_a_worker_see_the_same_events_as_a_reader_that_comes_after(
    settings: Settings, redis_url: str
) -> None:
    config = ScriptConfig(
        batches=[[{"tool": "slow_lookup", "arguments": {"q": "otters"}}]],
        final_text="Otters hold hands while they sleep: {tool_results}",
    )
    agent = Agent(name=name(), model=ScriptedModel(script=config), tools=[slow_lookup])
    client = Client(settings)
    handle = client.start(agent.name, input="otters?", stream=True)
    seen: list[list[RunEvent]] = [[], []]

    def read(i: int) -> None:
        seen[i].extend(client.stream(handle.run_id, timeout=30))

    readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(35)
    try:
        run = client.get_run(handle.run_id)
        assert run.status == S.COMPLETED
        assert seen[0] == seen[1] == list(client.stream(handle.run_id))
        events = seen[0]
        assert kinds(events)[:3] == ["RunStarted", "ToolCallStarted", "ToolCallCompleted"]
        assert kinds(events)[-1] == "RunCompleted" and text_of(events) == run.content
        assert_in_id_order(events)
        assert redis.Redis.from_url(redis_url).ttl(KEY.format(run_id=handle.run_id)) > 0
    finally:
        redis.Redis.from_url(redis_url).delete(KEY.format(run_id=handle.run_id))


@pytest.mark.usefixtures("worker")
def test_a_run_on_a_worker_that_was_not_streamed_writes_no_delta_and_still_yields_its_durable_events(
    settings: Settings, redis_url: str
) -> None:
    agent = tool_agent()
    client = Client(settings)
    handle = client.start(agent.name, input="otters?")

    events = list(client.stream(handle.run_id, timeout=30))

    assert kinds(events) == [
        "RunStarted", "ToolCallStarted", "ToolCallStarted", "ToolCallCompleted", "ToolCallCompleted", "RunCompleted",
    ]  # fmt: skip
    assert not redis.Redis.from_url(redis_url).exists(KEY.format(run_id=handle.run_id))


# ---------------------------------------------------------------- untrusted text, a sink that is down


def test_a_streamed_reply_with_a_lone_surrogate_streams_it_escaped_as_the_committed_reply_holds_it(
    inline: InMemoryDispatcher,
) -> None:
    agent = Agent(name=name(), model=ScriptedModel(script=ScriptConfig(final_text="odd \ud800 text")))

    events = list(agent.run("hello", stream=True))

    out = inline.client.get_run(events[0].run_id)
    assert out.status == S.COMPLETED and "\\ud800" in (out.content or "")
    assert (out.content or "").startswith(text_of(events))  # the deltas are the escaped text, before its note


def test_a_finished_streamed_run_is_read_from_the_database_while_its_delta_sink_is_down(
    inline: InMemoryDispatcher, settings: Settings
) -> None:
    from orchestrator.reader import Follower, follow
    from workers.redis.delta_sink import RedisDeltaSink

    agent = Agent(name=name(), model=ScriptedModel(script=ScriptConfig(final_text="all there")))
    run_id = inline.client.start(agent.name, input="hello", stream=True).run_id
    durable = durable_events(inline.store, run_id)[1]
    gone = RedisDeltaSink(settings, "redis://127.0.0.1:1/0")

    events = list(follow(Follower(inline.store, gone, run_id), timeout=30))

    assert events == durable and events[-1].event == "RunCompleted"


class CountingStore:
    """A real store whose `event_rows` reads are counted: how often a reader took a snapshot."""

    def __init__(self, store: object) -> None:
        self.store, self.reads = store, 0

    def event_rows(self, run_id: str, since: int = 0) -> object:
        self.reads += 1
        return self.store.event_rows(run_id, since=since)  # type: ignore[attr-defined]


@pytest.fixture
def redis_sink(settings: Settings) -> Iterator[object]:
    from workers.redis.delta_sink import RedisDeltaSink

    sink = RedisDeltaSink(settings, settings.broker_url)
    written: list[str] = []
    yield sink, written
    sink.discard(written)


def followed(inline: InMemoryDispatcher, redis_sink: tuple[object, list[str]]) -> tuple[Any, str, CountingStore, Any]:
    """A streamed run left QUEUED, and a reader on the Redis sink that has seen its start."""
    from orchestrator.reader import Follower

    sink, written = redis_sink
    agent = Agent(name=name(), model=ScriptedModel())
    inline.autorun = False
    run_id = inline.client.start(agent.name, input="hello", stream=True).run_id
    written.append(run_id)
    store = CountingStore(inline.store)
    follower = Follower(store, sink, run_id)  # type: ignore[arg-type]
    assert kinds(follower.poll()) == ["RunStarted"] and store.reads == 1
    return sink, run_id, store, follower


def streams(inline: InMemoryDispatcher, sink: Any, run_id: str, seq: int, text: str) -> None:
    """A worker claims the run's model step `seq` and streams `text` as one delta."""
    claim = inline.store.claim(run_id, seq, "model", owner=f"w{seq}", lease_seconds=30, max_attempts=5)
    assert claim is not None
    live = LiveStep(sink, claim, time.time)
    live.begin()
    live.delta(text)
    live.end()


def retried_and_streamed(inline: InMemoryDispatcher, sink: Any, run_id: str) -> None:
    """Unseen by the reader: a first attempt fails and is parked for a retry (RunRetrying), then
    a second claim streams "again"."""
    first = inline.store.claim(run_id, 0, "model", owner="w1", lease_seconds=30, max_attempts=5)
    assert first is not None
    error = {"type": "ModelCallError", "message": "a 500"}
    inline.store.park_for_retry(first, delay=0, published=False, error=error, publish_grace=5)
    streams(inline, sink, run_id, 1, "again")


def test_a_reader_woken_by_the_first_claims_delta_hands_it_out_without_reading_the_store_again(
    inline: InMemoryDispatcher, redis_sink: tuple[object, list[str]]
) -> None:
    sink, run_id, store, follower = followed(inline, redis_sink)
    streams(inline, sink, run_id, 0, "hel")

    follower.wait(10)
    events = follower.poll()

    assert [(e.event, e.content) for e in events] == [("RunContent", "hel")]
    assert store.reads == 1, "the delta of the claim after a QUEUED snapshot needs no new snapshot"


def test_a_woken_reader_reads_the_store_before_the_delta_of_a_later_claim_so_nothing_sorts_below_it(
    inline: InMemoryDispatcher, redis_sink: tuple[object, list[str]]
) -> None:
    sink, run_id, store, follower = followed(inline, redis_sink)
    retried_and_streamed(inline, sink, run_id)  # its deltas sort above the retry: the retry comes first

    follower.wait(10)
    events = follower.poll()

    assert kinds(events) == ["RunRetrying", "StepRestarted", "RunContent"]
    assert_in_id_order(events)
    assert store.reads == 2


def test_deltas_a_woken_reader_read_survive_a_failed_read_of_the_stream_that_follows(
    inline: InMemoryDispatcher, redis_sink: tuple[object, list[str]]
) -> None:
    sink, run_id, _, follower = followed(inline, redis_sink)
    retried_and_streamed(inline, sink, run_id)
    follower.wait(10)  # reads the later claim's deltas: held for a full poll
    real_read = sink.read

    def blip(run_id: str, cursor: str | None) -> Any:  # Redis drops the connection once
        sink.read = real_read
        raise redis.ConnectionError("connection reset")

    sink.read = blip
    events = follower.poll()

    assert kinds(events) == ["RunRetrying", "StepRestarted", "RunContent"]
    assert events[-1].content == "again"


def test_an_event_id_of_digits_that_are_not_ascii_is_refused_as_input() -> None:
    with pytest.raises(InvalidInputError, match="four non-negative integers"):
        parse_id("\u00b2-0-0-0")


def test_an_id_past_what_the_columns_hold_is_refused_as_input_and_one_at_the_limit_reads_nothing_more(
    inline: InMemoryDispatcher,
) -> None:
    run = Agent(name=name(), model=ScriptedModel()).run("hello")
    # Past the limit: refused before any read (PostgreSQL would fail comparing it with an INTEGER)
    for after in ("999999999999999999-0-0-0", f"{MAX_PART + 1}-0-0-0", f"0-{MAX_PART + 1}-0-0"):
        with pytest.raises(InvalidInputError, match=f"a part over {MAX_PART}"):
            list(inline.client.stream(run.run_id, after=after))
    # At the limit: after every event the run has, so nothing
    assert list(inline.client.stream(run.run_id, after=f"{MAX_PART}-{MAX_PART}-0-0")) == []


def test_the_delta_tables_ids_are_64_bits_so_a_busy_deployment_never_runs_out(db_url: str) -> None:
    from sqlalchemy import inspect

    from orchestrator.store import Store

    engine = Store.open(db_url).engine
    [column] = [c for c in inspect(engine).get_columns("ratchet_deltas") if c["name"] == "id"]
    # PostgreSQL: BIGINT (a 32-bit serial runs out within weeks at a thousand tokens a second);
    # SQLite: INTEGER, the 64-bit rowid, which BIGINT would not alias.
    assert str(column["type"]) == ("BIGINT" if engine.dialect.name == "postgresql" else "INTEGER")
