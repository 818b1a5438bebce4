"""Bounds on the runs waiting for a worker (QUEUED), on the in-memory dispatcher's SQLite store with
its steps run by hand: `Agent(max_queued=)`, RATCHET_MAX_QUEUED_PER_AGENT and _PER_USER refuse a
start with QueueFullError and write nothing, count only QUEUED runs, let a start sent again have
its run, never refuse a continue or a team's member, and skip a schedule's tick. Starts racing
on PostgreSQL and SQLite: tests/integration/test_queue_bounds.py; the HTTP API's 429 and the
command line's exit status: tests/unit/test_queue_ops_producers.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Agent, ConfigurationError, QueueFullError, RunConflictError, RunStatus, Team, tool
from orchestrator.settings import Settings
from orchestrator.store.backlog import Bound
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import Clock, CountingModel

S = RunStatus


def name() -> str:
    return f"queued-{uuid.uuid4().hex[:8]}"


def queued(inline: InMemoryDispatcher, agent: str) -> int:
    return inline.store.backlog.queued(Bound(scope="agent", key=agent, limit=1000, named="a test"))


@pytest.fixture
def held(inline: InMemoryDispatcher) -> InMemoryDispatcher:
    """The in-memory dispatcher, its steps run only when the test says: runs stay QUEUED."""
    inline.autorun = False
    return inline


@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[InMemoryDispatcher]:
    """The in-memory dispatcher with RATCHET_MAX_QUEUED_PER_AGENT=2 and _PER_USER=3, steps held."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'runs.db'}",
        sqlite_synchronous="NORMAL",
        dispatcher="orchestrator.testing:InMemoryDispatcher",
        max_queued_per_agent=2,
        max_queued_per_user=3,
    )
    with in_memory(settings, autorun=False) as dispatcher:
        yield dispatcher


def test_an_agents_max_queued_refuses_the_next_start_until_a_worker_takes_one(held: InMemoryDispatcher) -> None:
    agent = Agent(name=name(), model=CountingModel(), max_queued=2)
    first, second = agent.start("one").run_id, agent.start("two").run_id

    with pytest.raises(QueueFullError) as refused:
        agent.start("three")

    error = refused.value
    assert (error.scope, error.limit, error.queued) == ("agent", 2, 2)
    for said in (agent.name, "2 runs QUEUED", "its max_queued=2", "nothing was written", "Send it again"):
        assert said in str(error)
    assert queued(held, agent.name) == 2 and len(held.client.list_runs(agent=agent.name).runs) == 2
    assert held.run_next() is not None  # a worker takes one: it completes
    assert {held.store.get_record(r).status for r in (first, second)} == {S.COMPLETED, S.QUEUED}
    assert agent.start("three").run_id  # room again


def test_only_queued_runs_count_not_paused_failed_or_finished_ones(held: InMemoryDispatcher) -> None:
    @tool(requires_confirmation=True)
    def pay(to: str) -> str:
        """Pay someone."""
        return f"paid {to}"

    payer = Agent(name=name(), model=CountingModel(), tools=[pay], max_queued=1)
    payer.start("pay bob")
    held.run_until_idle()
    assert payer.client.get_run(held.client.list_runs(agent=payer.name).runs[0].run_id).status == S.PAUSED
    payer.start("pay ann")  # the PAUSED one does not count
    with pytest.raises(QueueFullError):
        payer.start("pay joe")

    failing = Agent(name=name(), model=CountingModel(script=ScriptConfig(faults=[Fault(status=400)])), max_queued=1)
    failed = failing.start("hi").run_id
    held.run_until_idle()
    assert held.store.get_record(failed).status == S.ERROR
    failing.start("hi")  # nor the one in ERROR


def test_a_start_sent_again_has_its_run_even_when_the_queue_is_full(held: InMemoryDispatcher) -> None:
    agent = Agent(name=name(), model=CountingModel(), max_queued=1)
    run_id = f"mine-{uuid.uuid4().hex[:8]}"
    assert agent.start("hi", run_id=run_id).run_id == run_id

    assert agent.start("hi", run_id=run_id).run_id == run_id  # a retry of the start that got in
    with pytest.raises(RunConflictError, match="another input"):
        agent.start("another", run_id=run_id)
    with pytest.raises(QueueFullError):
        agent.start("hi", run_id=f"other-{uuid.uuid4().hex[:8]}")


def test_a_continue_and_a_teams_member_are_never_refused(held: InMemoryDispatcher) -> None:
    member = Agent(name=name(), model=CountingModel(), role="Helps.", max_queued=1)
    call = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "help"}}
    team = Team(name=name(), model=CountingModel(script=ScriptConfig(batches=[[call]])), members=[member])
    team_run = team.start("go", priority=9).run_id  # its steps go first
    member.start("on its own")  # the member's agent is full
    held.run_next(), held.run_next()  # the leader's call, then its tool step delegates: the member run is written
    assert queued(held, member.name) == 2

    held.run_until_idle()
    assert held.store.get_record(team_run).status == S.COMPLETED

    failing = Agent(name=name(), model=CountingModel(script=ScriptConfig(faults=[Fault(status=400)])), max_queued=1)
    failed = failing.start("hi").run_id
    held.run_until_idle()
    failing.start("fills it")
    failing.client.continue_run(failed)  # a continue is not a start: taken, full or not
    assert held.store.get_record(failed).status == S.QUEUED and queued(held, failing.name) == 2


def test_the_settings_bound_every_agent_and_each_user_across_agents(bounded: InMemoryDispatcher) -> None:
    plain, own = Agent(name=name(), model=CountingModel()), Agent(name=name(), model=CountingModel(), max_queued=9)
    plain.start("a"), plain.start("b")
    with pytest.raises(QueueFullError, match="RATCHET_MAX_QUEUED_PER_AGENT=2"):
        plain.start("c")
    for text in "abc":
        own.start(text)  # its own max_queued wins over the setting

    other = Agent(name=name(), model=CountingModel())
    other.start("x", user_id="ann"), own.start("y", user_id="ann"), own.start("z", user_id="bob")
    other.start("w", user_id="ann")
    with pytest.raises(QueueFullError, match="RATCHET_MAX_QUEUED_PER_USER=3") as refused:
        own.start("v", user_id="ann")  # ann has 3 QUEUED, across agents
    assert (refused.value.scope, refused.value.limit) == ("user", 3)
    own.start("u", user_id="bob")  # bob has 1


def test_a_schedules_tick_is_skipped_when_its_agents_queue_is_full(held: InMemoryDispatcher, clock: Clock) -> None:
    agent = Agent(name=name(), model=CountingModel(), max_queued=1)
    agent.start("waiting")
    made = held.client.schedule(agent.name, cron="* * * * *", input="report", schedule_id=f"s-{uuid.uuid4().hex[:6]}")
    clock.advance(made.next_at - clock() + 1)

    held.sweep()

    assert len(held.client.list_runs(agent=agent.name).runs) == 1  # the tick's run was not written
    [moved] = held.client.schedules()
    assert moved.next_at == made.next_at + 60  # and the schedule moved on to its next tick


def test_max_queued_is_a_whole_number_of_runs_and_the_settings_one_or_more() -> None:
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ConfigurationError, match="max_queued"):
            Agent(name=name(), model=CountingModel(), max_queued=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="RATCHET_MAX_QUEUED_PER_USER must be at least 1"):
        Settings.from_env({"RATCHET_MAX_QUEUED_PER_USER": "0"})
    assert Settings.from_env({"RATCHET_MAX_QUEUED_PER_AGENT": "10"}).max_queued_per_agent == 10
