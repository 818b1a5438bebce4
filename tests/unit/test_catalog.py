"""The agent catalog (`orchestrator.catalog`): a definition described from its public attributes
and hashed, written by what serves it, read by a producer that does not import it (which then
routes and records the run as the definition says), and marked not live once no worker has
seen it for a while. On a real SQLite store with the in-memory dispatcher; real workers write it
at boot in tests/integration/test_routing_workers.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from pydantic import BaseModel

from orchestrator import Agent, Client, Team, tool
from orchestrator import agent as agent_module
from orchestrator.catalog import (
    CatalogKeeper,
    Definition,
    DefinitionCache,
    describe,
    entries,
    live_seconds,
    write_served,
)
from orchestrator.ports import StepRef
from orchestrator.requirements import pause_type_of
from orchestrator.testing import InMemoryDispatcher
from tests.support import Clock, CountingModel


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


@tool(queue="gpu", at_most_once=True)
def render(scene: str) -> str:
    """Render a scene on a GPU."""
    return f"rendered {scene}"


class Answer(BaseModel):
    text: str


@pytest.fixture(autouse=True)
def _forget_agents() -> Iterator[None]:
    """Agents defined here name queues: forget them after the test (see test_routing.py)."""
    before = set(agent_module._registry)
    yield
    for added in set(agent_module._registry) - before:
        agent_module._registry.pop(added, None)
        agent_module._sites.pop(added, None)


def unregister(*names: str) -> None:
    """As a producer process that never imported these agents."""
    for n in names:
        agent_module._registry.pop(n, None)
        agent_module._sites.pop(n, None)


class Recorder:
    """The broker port, keeping what it is asked to publish."""

    def __init__(self) -> None:
        self.steps: list[StepRef] = []

    def publish(self, step: StepRef) -> None:
        self.steps.append(step)


def test_a_definition_says_its_model_tools_flags_members_schema_and_queues_and_hashes_the_same_each_time() -> None:
    member = Agent(name=name("member"), model=CountingModel(), tools=[lookup])
    team = Team(
        name=name("team"), model=CountingModel(), members=[member], tools=[render], output_schema=Answer, queue="q1"
    )

    d = describe(team)

    assert (d.name, d.kind, d.members, d.queue, d.tool_queue) == (team.name, "team", (member.name,), "q1", "gpu")
    assert d.model == {"provider": None, "id": team.model.id}
    assert [(t.name, t.flags) for t in d.tools] == [("render", {"at_most_once": True, "queue": "gpu"})]
    assert d.tools[0].parameters["properties"] == {"scene": {"type": "string"}}
    assert d.output_schema == Answer.model_json_schema()
    assert d.instructions_digest is not None and len(d.hash) == 64
    # A flag at its default is left out, so a flag added later does not move this hash
    assert [t.flags for t in describe(member).tools] == [{}]
    # Stored and read back it is the same definition, with the same hash
    assert Definition.from_json(d.to_json()) == d


def test_two_definitions_differ_in_hash_when_a_tool_schema_or_the_instructions_differ() -> None:
    first = Agent(name=name("a"), model=CountingModel(), tools=[lookup], instructions="Be brief.")

    def lookup2(query: str, limit: int) -> str:
        """Look something up."""
        return query

    same = Agent(name=name("b"), model=CountingModel(), tools=[lookup], instructions="Be brief.")
    other_tool = Agent(name=name("c"), model=CountingModel(), tools=[lookup2], instructions="Be brief.")
    other_text = Agent(name=name("d"), model=CountingModel(), tools=[lookup], instructions="Be long.")

    def body_without_name(a: Agent) -> dict[str, object]:
        return {k: v for k, v in describe(a).body().items() if k != "name"}

    assert body_without_name(first) == body_without_name(same)
    assert body_without_name(first) != body_without_name(other_tool)
    assert describe(first).instructions_digest != describe(other_text).instructions_digest


def test_a_run_records_the_hash_of_the_definition_it_started_with_and_the_catalog_holds_it(
    inline: InMemoryDispatcher,
) -> None:
    agent = Agent(name=name("hashed"), model=CountingModel())

    out = agent.run("hello")

    assert out.definition_hash == describe(agent).hash
    assert inline.store.get_record(out.run_id).definition_hash == describe(agent).hash
    [entry] = entries(inline.store, inline.settings, agent.name)
    assert entry.live and entry.definition == describe(agent)


def test_a_producer_that_does_not_import_a_team_routes_its_first_step_and_records_it_from_the_catalog(
    inline: InMemoryDispatcher,
) -> None:
    # Given a worker served a team on a queue of its own
    member = Agent(name=name("member"), model=CountingModel())
    team = Team(name=name("remote"), model=CountingModel(), members=[member], queue="team-q")
    served = write_served(inline.store, [team, member])
    unregister(team.name, member.name)
    recorder = Recorder()

    # When a producer that never imported it starts it
    run_id = Client(inline.settings, store=inline.store, dispatcher=recorder).start(team.name, input="hi").run_id

    # Then its first step goes straight to the team's queue, and the row says team, with the hash
    assert recorder.steps == [StepRef(run_id=run_id, seq=0, kind="model", queue="team-q")]
    record = inline.store.get_record(run_id)
    assert (record.kind, record.definition_hash) == ("team", served[0].hash)


def test_a_producer_without_a_catalog_entry_publishes_unrouted_as_before(inline: InMemoryDispatcher) -> None:
    recorder = Recorder()
    run_id = Client(inline.settings, store=inline.store, dispatcher=recorder).start(name("nowhere"), input="hi").run_id

    assert recorder.steps == [StepRef(run_id=run_id, seq=0, kind="model", routed=False)]
    record = inline.store.get_record(run_id)
    assert (record.kind, record.definition_hash) == ("agent", None)


def test_a_definition_no_worker_saw_lately_is_not_live_says_when_it_was_last_seen_and_does_not_route(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    agent = Agent(name=name("stale"), model=CountingModel(), queue="old-q")
    keeper = CatalogKeeper(lambda: inline.store, inline.settings, agents=lambda: [agent])
    keeper.write()
    seen = inline.store.catalog.read(agent.name)[0].last_seen
    unregister(agent.name)

    # Within the live window it is live, and routes
    clock.advance(live_seconds(inline.settings) - 1)
    [entry] = entries(inline.store, inline.settings, agent.name)
    assert entry.live and entry.last_seen == seen
    assert DefinitionCache(inline.store).live(agent.name, inline.settings) == describe(agent)

    # Past it, nothing marked it seen: not live, last seen when its worker last said so
    clock.advance(2)
    [entry] = entries(inline.store, inline.settings, agent.name)
    assert not entry.live and entry.last_seen == seen
    assert DefinitionCache(inline.store).live(agent.name, inline.settings) is None
    recorder = Recorder()
    run_id = Client(inline.settings, store=inline.store, dispatcher=recorder).start(agent.name, input="hi").run_id
    assert recorder.steps == [StepRef(run_id=run_id, seq=0, kind="model", routed=False)]

    # A worker that serves it again marks it seen: live again, first seen unchanged
    keeper.write()
    [entry] = entries(inline.store, inline.settings, agent.name)
    assert entry.live and entry.first_seen == seen and entry.last_seen > seen


def test_two_versions_of_one_agent_are_two_entries_and_the_one_seen_last_is_the_live_definition(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    agent_name = name("versioned")
    old = Agent(name=agent_name, model=CountingModel(), queue="v1")
    write_served(inline.store, [old])
    unregister(agent_name)
    clock.advance(5)
    new = Agent(name=agent_name, model=CountingModel(), queue="v2")
    write_served(inline.store, [new])
    unregister(agent_name)

    versions = entries(inline.store, inline.settings, agent_name)

    assert [e.definition.queue for e in versions] == ["v2", "v1"]
    assert DefinitionCache(inline.store).live(agent_name, inline.settings) == describe(new)


def test_a_producer_reads_the_catalog_once_in_a_while_not_on_every_start(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name("cached"), model=CountingModel())
    write_served(inline.store, [agent])
    unregister(agent.name)
    cache = DefinitionCache(inline.store)
    reads = []
    real = inline.store.catalog.latest

    def counted(n: str) -> object:
        reads.append(n)
        return real(n)

    inline.store.catalog.latest = counted  # type: ignore[method-assign]
    try:
        for _ in range(5):
            assert cache.live(agent.name, inline.settings) is not None
    finally:
        del inline.store.catalog.latest
    assert reads == [agent.name]


@pytest.mark.parametrize("external", [False, True])
@pytest.mark.parametrize("user_input", [False, True])
@pytest.mark.parametrize("confirmation", [False, True])
def test_a_tool_and_its_catalog_entry_pause_for_the_same_thing_by_one_priority(
    external: bool, user_input: bool, confirmation: bool
) -> None:
    @tool(external_execution=external, requires_user_input=user_input, requires_confirmation=confirmation)
    def act(target: str) -> str:
        """Act on a target."""
        return target

    agent = Agent(name=name("pauser"), model=CountingModel(), tools=[act])
    expected = pause_type_of(
        external_execution=external, requires_user_input=user_input, requires_confirmation=confirmation
    )
    assert expected == (
        "external_execution" if external else "user_input" if user_input else "confirmation" if confirmation else None
    )
    (described,) = describe(agent).tools
    assert act.pause_type == described.pause_type == expected
