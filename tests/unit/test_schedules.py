"""Schedules: cron ticks in a time zone (clock changes included), fired by sweeper passes of the
in-memory dispatcher on a clock the test moves, one run per tick however many sweepers fire it
(two at once on PostgreSQL), and the latest missed tick only after an outage."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Iterator
from typing import cast

import pytest

from orchestrator import Agent, RunStatus, cron, schedules, starting
from orchestrator.errors import (
    AgentNotFoundError,
    InvalidInputError,
    ScheduleConflictError,
    ScheduleNotFoundError,
    SessionOwnedError,
)
from orchestrator.idempotency import StartRequest
from orchestrator.ports import StepRef
from orchestrator.store import Store
from orchestrator.store.database import open_engine
from orchestrator.store.schedule_rows import Schedule
from orchestrator.testing import InMemoryDispatcher
from tests.conftest import make_settings
from tests.support import Clock, CountingModel, RecordingDispatcher

UTC = dt.UTC


def at(text: str, zone: str = "UTC") -> float:
    """UNIX seconds of a local wall time in `zone` (its first occurrence)."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=cron.zone(zone)).timestamp()


def utc(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M")


def ticks(expression: str, zone: str, start: str, count: int) -> list[str]:
    """The first `count` ticks after local `start`, in UTC."""
    parsed, tz, found, after = cron.parse(expression), cron.zone(zone), [], at(start, zone)
    for _ in range(count):
        after = cron.next_tick(parsed, tz, after)
        found.append(utc(after))
    return found


# ---------------------------------------------------------------- ticks


def test_fields_steps_ranges_names_and_macros() -> None:
    assert ticks("*/20 * * * *", "UTC", "2026-01-01 10:05", 3) == [
        "2026-01-01 10:20",
        "2026-01-01 10:40",
        "2026-01-01 11:00",
    ]
    assert ticks("0 9 * * mon-fri", "UTC", "2026-01-02 10:00", 2) == [
        "2026-01-05 09:00",
        "2026-01-06 09:00",
    ]  # Fri -> Mon
    assert ticks("@monthly", "UTC", "2026-01-15 00:00", 1) == ["2026-02-01 00:00"]
    assert ticks("0 0 * * 7", "UTC", "2026-01-01 00:00", 1) == ["2026-01-04 00:00"]  # 7 is Sunday


def test_both_day_fields_restricted_fire_on_either_as_cron_does() -> None:
    # The 13th of a month, or any Friday: Fri 2 Jan, Fri 9 Jan, Tue 13 Jan.
    assert ticks("0 0 13 * fri", "UTC", "2026-01-01 00:00", 3) == [
        "2026-01-02 00:00",
        "2026-01-09 00:00",
        "2026-01-13 00:00",
    ]


def test_a_zones_wall_clock_is_kept_across_summer_time() -> None:
    assert ticks("0 9 * * *", "Europe/Paris", "2026-01-10 12:00", 1) == ["2026-01-11 08:00"]  # CET, +1
    assert ticks("0 9 * * *", "Europe/Paris", "2026-07-10 12:00", 1) == ["2026-07-11 07:00"]  # CEST, +2


def test_a_local_time_the_clocks_skip_fires_once_an_hour_later() -> None:
    # New York skips 02:00-03:00 on 8 March 2026: 02:30 does not exist and fires at 03:30 EDT
    # (07:30 UTC), the same instant as 03:30's tick, once; the days around keep 02:30 and 03:30.
    assert ticks("30 2,3 * * *", "America/New_York", "2026-03-07 12:00", 3) == [
        "2026-03-08 07:30",  # 02:30 EST read as 03:30 EDT, and 03:30 EDT: one tick
        "2026-03-09 06:30",  # 02:30 EDT
        "2026-03-09 07:30",  # 03:30 EDT
    ]


def test_a_local_time_that_happens_twice_fires_once_for_a_fixed_hour_and_twice_for_every_hour() -> None:
    # New York repeats 01:00-02:00 on 1 November 2026: 01:30 EDT (05:30 UTC), then 01:30 EST
    # (06:30 UTC), which a daily job does not fire at again.
    assert ticks("30 1 * * *", "America/New_York", "2026-10-31 12:00", 2) == ["2026-11-01 05:30", "2026-11-02 06:30"]
    # Every 30 minutes (hour `*`): every half hour of real time, the repeated hour's both times.
    assert ticks("*/30 * * * *", "America/New_York", "2026-11-01 00:45", 5) == [
        "2026-11-01 05:00", "2026-11-01 05:30", "2026-11-01 06:00", "2026-11-01 06:30", "2026-11-01 07:00",
    ]  # fmt: skip
    # The latest tick passed (what a pass fires) sees the second occurrence too.
    parsed, tz = cron.parse("*/30 * * * *"), cron.zone("America/New_York")
    latest = cron.latest_tick(parsed, tz, at("2026-11-01 06:40", "UTC"), not_before=at("2026-11-01 05:10", "UTC"))
    assert latest is not None and utc(latest) == "2026-11-01 06:30"


@pytest.mark.parametrize(
    ("expression", "says"),
    [
        ("* * * *", "has 4 fields"),
        ("61 * * * *", "the minute field '61'"),
        ("* * * foo *", "the month field 'foo'"),
        ("*/0 * * * *", "the minute field"),
        ("5-1 * * * *", "the minute field"),
    ],
)
def test_a_malformed_expression_says_which_field_and_the_rule(expression: str, says: str) -> None:
    with pytest.raises(InvalidInputError, match=says) as caught:
        cron.parse(expression)
    assert "@daily" in str(caught.value) or "ranges" in str(caught.value)


def test_an_expression_that_never_fires_and_an_unknown_zone_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="never fires"):
        cron.next_tick(cron.parse("0 0 30 2 *"), cron.zone("UTC"), 0.0)
    with pytest.raises(InvalidInputError, match="IANA"):
        cron.zone("Mars/Olympus")


# ---------------------------------------------------------------- fired by the sweeper


@pytest.fixture
def agent() -> Agent:
    return Agent(name=f"sched-{uuid.uuid4().hex[:8]}", model=CountingModel())


def test_a_tick_starts_one_run_named_by_the_schedule_and_the_tick(
    inline: InMemoryDispatcher, clock: Clock, agent: Agent
) -> None:
    client = inline.client
    made = client.schedule(agent.name, cron="* * * * *", input="daily report", schedule_id="report")
    assert [s.schedule_id for s in client.schedules()] == ["report"]
    assert not inline.sweep().scheduled  # the first tick is the first minute after now

    clock.advance(made.next_at - clock() + 1)
    first = inline.sweep()
    run_id = schedules.run_id_for("report", made.next_at)
    assert (
        first.scheduled == [run_id] and run_id == f"report:{dt.datetime.fromtimestamp(made.next_at, UTC):%Y%m%dT%H%MZ}"
    )
    assert client.get_run(run_id).status == RunStatus.COMPLETED and cast(CountingModel, agent.model).calls == [
        (run_id, 0)
    ]
    assert not inline.sweep().scheduled  # the same minute again: nothing

    (stored,) = client.schedules()
    assert (stored.last_tick, stored.last_run_id, stored.next_at) == (made.next_at, run_id, made.next_at + 60)
    with pytest.raises(ScheduleConflictError, match="exists already"):
        client.schedule(agent.name, cron="@daily", input="x", schedule_id="report")
    client.unschedule("report")
    clock.advance(120)
    assert not inline.sweep().scheduled and client.schedules() == []
    with pytest.raises(ScheduleNotFoundError):
        client.unschedule("report")


def test_a_schedule_of_an_unknown_agent_or_on_another_users_session_is_refused_and_not_stored(
    inline: InMemoryDispatcher, agent: Agent
) -> None:
    client = inline.client
    with pytest.raises(AgentNotFoundError, match="no worker has served it"):
        client.schedule("made-up-agent", cron="* * * * *", input="x")
    client.start(agent.name, input="hi", session_id="bobs", user_id="bob")  # the session is bob's
    for other in ("alice", None):
        with pytest.raises(SessionOwnedError, match="belongs to another user"):
            client.schedule(agent.name, cron="* * * * *", input="x", session_id="bobs", user_id=other)
    assert client.schedules() == []
    client.schedule(agent.name, cron="* * * * *", input="x", session_id="bobs", user_id="bob")  # the owner's
    client.schedule(agent.name, cron="* * * * *", input="x", session_id="new-one", user_id="alice")  # no session yet
    assert len(client.schedules()) == 2


def test_after_an_outage_only_the_latest_missed_tick_fires(
    inline: InMemoryDispatcher, clock: Clock, agent: Agent
) -> None:
    made = inline.client.schedule(agent.name, cron="*/5 * * * *", input="poll", schedule_id="poll")
    clock.advance(made.next_at - clock() + 3 * 3600 + 1)  # 3 h with nobody sweeping: 37 ticks passed
    latest = made.next_at + 3 * 3600
    assert inline.sweep().scheduled == [schedules.run_id_for("poll", latest)]
    assert len(inline.client.list_runs(agent=agent.name).runs) == 1
    assert inline.client.schedules()[0].next_at == latest + 300


def test_a_tick_fired_again_by_a_pass_cut_short_or_a_second_beat_starts_no_second_run(
    inline: InMemoryDispatcher, clock: Clock, agent: Agent
) -> None:
    made = inline.client.schedule(agent.name, cron="* * * * *", input="once", schedule_id="once")
    clock.advance(made.next_at - clock() + 1)
    store, settings = inline.store, inline.settings
    published: list[StepRef] = []
    # A beat that started the run and died before moving the schedule on: the row is still due.
    run_id = schedules.run_id_for("once", made.next_at)
    request = StartRequest.checked(
        agent=agent.name, input="once", session_id=None, user_id=None, stream=False, priority=None, session_state=None
    )
    assert starting.write(store, settings, request, run_id) is not None
    (due,) = store.schedules.due(clock())
    fired = schedules.fire(store, settings, published.append, due, now=clock())  # the restarted beat
    assert fired is not None and fired.run_id == run_id and published == []  # the run exists: nothing published
    assert schedules.fire(store, settings, published.append, due, now=clock()) is None  # a second beat, late
    assert [r.run_id for r in inline.client.list_runs(agent=agent.name).runs] == [run_id]


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    store = Store(open_engine(pg_url))
    yield store
    store.dispose()


def test_two_sweepers_firing_one_tick_at_once_on_postgresql_start_one_run(pg_store: Store, redis_url: str) -> None:
    settings = make_settings(str(pg_store.engine.url.render_as_string(hide_password=False)), redis_url)
    name = Agent(name=f"sched-{uuid.uuid4().hex[:8]}", model=CountingModel()).name  # defined here: known
    made = schedules.create(pg_store, name, cron_text="* * * * *", timezone="UTC", input="race", new_id="race")
    now = made.next_at + 1
    row: Schedule = pg_store.schedules.due(now)[0]
    dispatcher = RecordingDispatcher()
    barrier, results = threading.Barrier(2), []

    def sweep() -> None:
        barrier.wait()
        results.append(schedules.fire(pg_store, settings, dispatcher.publish, row, now=now))

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    run_id = schedules.run_id_for("race", made.next_at)
    assert len([r for r in results if r is not None]) == 1 and len(results) == 2
    assert [step.run_id for step in dispatcher.steps] == [run_id]  # one first step published
    assert pg_store.get_record(run_id).status == RunStatus.QUEUED


def test_a_tick_whose_run_id_another_requests_run_holds_is_skipped_and_the_schedule_moves_on(
    inline: InMemoryDispatcher, clock: Clock, agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    made = inline.client.schedule(agent.name, cron="* * * * *", input="the new input", schedule_id="again")
    clock.advance(made.next_at - clock() + 1)
    run_id = schedules.run_id_for("again", made.next_at)
    inline.client.start(agent.name, input="the old input", run_id=run_id)  # a schedule of the same id, before
    published: list[StepRef] = []
    (due,) = inline.store.schedules.due(clock())
    fired = schedules.fire(inline.store, inline.settings, published.append, due, now=clock())
    assert fired is not None and published == [] and "not started" in caplog.text
    assert inline.client.schedules()[0].next_at == made.next_at + 60
