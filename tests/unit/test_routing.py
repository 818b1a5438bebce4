"""Routing and priorities, as every publisher applies them (`orchestrator.routing`): the queue an
agent or a tool names, the priority a run was started with, on every step of the run, whoever
publishes it (the producer, a step, a continue, the sweeper), on a real SQLite store with the
in-memory dispatcher recording each step. Real brokers keep the order in
tests/integration/test_priorities.py; workers on their own queues in test_routing_workers.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator import Agent, Client, RunStatus, Team, Toolkit, tool
from orchestrator import agent as agent_module
from orchestrator.errors import ConfigurationError, InvalidInputError, RunNotFoundError
from orchestrator.ports import StepRef
from orchestrator.routing import named_queues
from orchestrator.runtime import build
from orchestrator.steps import StepRunner
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import Clock, CountingModel

S = RunStatus


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


@tool(queue="gpu")
def render(scene: str) -> str:
    """Render a scene on a GPU."""
    return f"rendered {scene}"


@pytest.fixture(autouse=True)
def _forget_routed_agents() -> Iterator[None]:
    """The agents a test defines here name queues: forget them after it, or every embedded worker
    later in the session would consume those queues (`routing.named_queues`) on shared brokers."""
    before = set(agent_module._registry)
    yield
    for added in set(agent_module._registry) - before:
        agent_module._registry.pop(added, None)
        agent_module._sites.pop(added, None)


def steps(inline: InMemoryDispatcher) -> list[tuple[str, int, str | None, int | None]]:
    return [(s.kind, s.seq, s.queue, s.priority) for s in inline.published]


def calls(*names: str) -> list[dict[str, Any]]:
    return [{"tool": n, "arguments": {"query": "x"} if n == "lookup" else {"scene": "x"}} for n in names]


class Recorder:
    """The broker port, keeping what it is asked to publish."""

    def __init__(self) -> None:
        self.steps: list[StepRef] = []

    def publish(self, step: StepRef) -> None:
        self.steps.append(step)


def test_an_agent_with_a_queue_sends_its_model_calls_and_tool_batches_there(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name("private"), model=CountingModel(), tools=[lookup], queue="private-net")

    assert agent.run("otters").status == S.COMPLETED
    assert steps(inline) == [("model", 0, "private-net", None), ("tools", 1, "private-net", None),
                             ("model", 2, "private-net", None)]  # fmt: skip


def test_a_batch_goes_to_its_tools_queue_only_when_it_calls_that_tool_even_beside_other_tools(
    inline: InMemoryDispatcher,
) -> None:
    model = CountingModel(script=ScriptConfig(batches=[calls("lookup"), calls("render", "lookup"), calls("lookup")]))
    agent = Agent(name=name("artist"), model=model, tools=[lookup, render])

    assert agent.run("a cat").status == S.COMPLETED
    assert [(kind, queue) for kind, _, queue, _ in steps(inline)] == [
        ("model", None), ("tools", None), ("model", None), ("tools", "gpu"), ("model", None), ("tools", None),
        ("model", None),
    ]  # fmt: skip


def test_a_tools_queue_takes_its_batches_from_the_agents_own_queue(inline: InMemoryDispatcher) -> None:
    model = CountingModel(script=ScriptConfig(batches=[calls("render"), calls("lookup")]))
    agent = Agent(name=name("both"), model=model, tools=[lookup, render], queue="private-net")

    agent.run("a cat")
    assert [queue for _, _, queue, _ in steps(inline)] == ["private-net", "gpu", "private-net", "private-net",
                                                            "private-net"]  # fmt: skip


def test_tools_naming_two_queues_or_an_invalid_queue_are_refused_when_the_agent_is_defined() -> None:
    @tool(queue="other")
    def transcode(path: str) -> str:
        """Transcode a video."""
        return path

    with pytest.raises(ConfigurationError, match=r"name 2 queues \['gpu', 'other'\].*same queue"):
        Agent(name=name("split"), model=CountingModel(), tools=[render, transcode])
    with pytest.raises(ConfigurationError, match="not a queue name"):
        Agent(name=name("bad"), model=CountingModel(), queue="gpu,cpu")
    with pytest.raises(ConfigurationError, match="not a queue name"):
        tool(queue="")(lookup)


def test_a_toolkits_queue_is_the_queue_of_its_tools_that_name_none(inline: InMemoryDispatcher) -> None:
    kit = Toolkit(name="kit", tools=[lookup], queue="vpn")
    assert [t.queue for t in kit.tools] == ["vpn"]
    assert [t.queue for t in Toolkit(name="kit2", tools=[render], queue="vpn").tools] == ["gpu"]

    agent = Agent(name=name("kitted"), model=CountingModel(), tools=[kit])
    agent.run("otters")
    assert [queue for _, _, queue, _ in steps(inline)] == [None, "vpn", None]


def test_every_step_of_a_run_carries_its_priority_retries_included(inline: InMemoryDispatcher) -> None:
    model = CountingModel(script=ScriptConfig(faults=[Fault(turn=2, status=500)]))
    agent = Agent(name=name("urgent"), model=model, tools=[render])

    out = agent.run("a cat", priority=7)

    assert out.status == S.COMPLETED and out.priority == 7
    assert steps(inline) == [("model", 0, None, 7), ("tools", 1, "gpu", 7), ("model", 2, None, 7),
                             ("model", 3, None, 7)]  # fmt: skip
    assert inline.published[-1].countdown is not None  # the retry


def test_a_teams_members_run_at_its_priority_on_their_own_queues(inline: InMemoryDispatcher) -> None:
    member = Agent(name=name("member"), model=CountingModel(), tools=[lookup], queue="vpn")
    leader = CountingModel()
    team = Team(name=name("team"), model=leader, members=[member], queue="leaders")
    leader.script = ScriptConfig(batches=[[{"tool": TO_MEMBER, "arguments": {"member_id": member_id(member),
                                                                             "task": "dig"}}]])  # fmt: skip

    out = team.run("go", priority=3)

    assert out.status == S.COMPLETED and [m.priority for m in out.member_runs] == [3]
    by_run = {(s.run_id == out.run_id, s.queue) for s in inline.published}
    assert by_run == {(True, "leaders"), (False, "vpn")}
    assert {s.priority for s in inline.published} == {3}


def test_a_higher_priority_runs_first_among_the_steps_due(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name("queued"), model=CountingModel())
    inline.autorun = False
    low = agent.start("low").run_id
    none = agent.start("none").run_id
    high = agent.start("high", priority=9).run_id
    mid = agent.start("mid", priority=4).run_id

    assert [s.run_id for s in inline.pending] == [high, mid, low, none]


@pytest.mark.parametrize("bad", [10, -1, True, "5", 2.0])
def test_a_priority_out_of_0_to_9_is_refused_before_anything_is_written(inline: InMemoryDispatcher, bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="priority"):
        inline.client.start("anyone", input="hi", run_id="r-bad", priority=bad)
    with pytest.raises(RunNotFoundError):
        inline.client.get_run("r-bad")
    assert inline.published == []


def test_a_continue_and_the_sweepers_republish_route_a_batch_as_its_first_publish_did(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    model = CountingModel(script=ScriptConfig(tool="render"))
    agent = Agent(name=name("resumed"), model=model, tools=[lookup, render], queue="private-net")
    inline.autorun = False
    run_id = agent.start("a cat", priority=5).run_id
    inline.run_next()  # the model asks for render: a gpu batch
    store = inline.store
    tools_step = ("tools", 1, "gpu", 5)
    assert steps(inline)[-1] == tools_step

    clock.advance(61)  # its message was lost: past RATCHET_PUBLISH_GRACE_SECONDS the sweeper republishes
    assert inline.sweep().republished == [run_id]
    assert steps(inline)[-1] == tools_step

    claim = store.claim(run_id, 1, "tools", owner="crashed", lease_seconds=30, max_attempts=5)
    assert claim is not None
    clock.advance(31)  # its worker died: the lease expires, the sweeper takes the step back
    assert inline.sweep().requeued == [run_id]
    assert steps(inline)[-1] == ("tools", 1, "gpu", 5)

    claim = store.claim(run_id, 1, "tools", owner="failing", lease_seconds=30, max_attempts=5)
    assert claim is not None
    store.fail(run_id, epoch=claim.epoch, error={"type": "Boom", "message": "the batch failed"})
    inline.client.continue_run(run_id)  # resumes in place, at the batch it owes
    assert steps(inline)[-1] == ("tools", 2, "gpu", 5)
    inline.run_until_idle()
    assert inline.client.get_run(run_id).status == S.COMPLETED
    assert steps(inline)[-1] == ("model", 3, "private-net", 5)


def test_a_fork_keeps_its_runs_priority(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name("forked"), model=CountingModel())
    done = agent.run("first", priority=6)

    fork = agent.continue_run(done.run_id, input="again")

    assert fork.forked_from == done.run_id and fork.priority == 6
    assert steps(inline)[-1] == ("model", 0, None, 6)


def test_a_step_its_publisher_could_not_route_is_sent_on_to_its_agents_queue(inline: InMemoryDispatcher) -> None:
    # A producer that does not define the agent publishes its first step unrouted...
    agent_name = name("elsewhere")
    recorder = Recorder()
    producer = Client(inline.settings, store=inline.store, dispatcher=recorder)
    run_id = producer.start(agent_name, input="hi", priority=2).run_id
    assert recorder.steps == [StepRef(run_id=run_id, seq=0, kind="model", priority=2, routed=False)]

    # ...and a worker that does sends it on to the agent's queue, at its priority.
    Agent(name=agent_name, model=CountingModel(), queue="private-net")
    worker = StepRunner(build(inline.settings, store=inline.store, dispatcher=recorder))
    assert worker.reroute(run_id, 0, "model") is True
    assert recorder.steps[-1] == StepRef(run_id=run_id, seq=0, kind="model", queue="private-net", priority=2)
    assert worker.reroute(run_id, 1, "model") is False  # stale: the claim drops it


def test_an_embedded_worker_adds_the_queues_the_processs_agents_and_tools_name(inline: InMemoryDispatcher) -> None:
    Agent(name=name("routed"), model=CountingModel(), tools=[render], queue="private-net")

    assert {"gpu", "private-net"} <= named_queues()


def test_a_step_of_an_agent_on_the_default_queues_is_not_sent_on(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name("plain"), model=CountingModel())
    recorder = Recorder()
    run_id = Client(inline.settings, store=inline.store, dispatcher=recorder).start(agent.name, input="hi").run_id

    assert (
        StepRunner(build(inline.settings, store=inline.store, dispatcher=recorder)).reroute(run_id, 0, "model") is False
    )
    assert recorder.steps == [StepRef(run_id=run_id, seq=0, kind="model")]
