"""The in-memory dispatcher: steps run inline, one after another, on a real SQLite store, with
countdowns on a virtual clock and failures through the worker's failure handler."""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path

from orchestrator import Agent, Client, RunStatus, Settings, runtime
from orchestrator.messages import Message
from orchestrator.models.base import CallContext, ModelReply, ToolSpec
from orchestrator.ports import StepRef
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import CountingModel

S = RunStatus


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def test_a_run_has_ended_when_start_returns_with_no_broker_and_no_worker(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name("inline"), model=CountingModel(), tools=[lookup])

    handle = agent.start("otters")

    assert handle.status() == S.COMPLETED
    out = handle.wait(timeout=0)
    assert [m.role for m in out.messages] == ["user", "assistant", "tool", "assistant"]
    assert out.content == "Summary: found otters"
    assert [(s.kind, s.seq, s.countdown) for s in inline.published] == [
        ("model", 0, None),
        ("tools", 1, None),
        ("model", 2, None),
    ]
    assert inline.pending == [] and inline.now == 0.0


def test_a_step_published_by_a_step_runs_after_it_so_the_stack_stays_flat(inline: InMemoryDispatcher) -> None:
    depths: list[int] = []

    class Probe(CountingModel):
        def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
            depths.append(len(traceback.extract_stack()))
            return super().invoke(messages, tools, context=context)

    agent = Agent(name=name("long"), model=Probe(script=ScriptConfig(tool_batches=6)), tools=[lookup])

    out = agent.run("otters")

    assert out.status == S.COMPLETED and len(depths) == 7
    assert len(set(depths)) == 1, f"each model call ran deeper than the last: {depths}"


def test_a_run_started_inside_a_tool_is_queued_behind_the_step_and_then_runs(inline: InMemoryDispatcher) -> None:
    inner = Agent(name=name("inner"), model=CountingModel(script=ScriptConfig(final_text="inner done")))
    seen: list[tuple[str, RunStatus]] = []

    def spawn(query: str) -> str:
        """Start another run."""
        handle = inner.start(query)
        seen.append((handle.run_id, handle.status()))
        return handle.run_id

    outer = Agent(name=name("outer"), model=CountingModel(), tools=[spawn])

    out = outer.run("go")

    ((inner_id, status_inside),) = seen
    assert status_inside == S.QUEUED  # not run inside the tool's step...
    assert out.status == S.COMPLETED
    assert inline.client.get_run(inner_id).content == "inner done"  # ...but by the same drain


def test_countdowns_run_on_a_virtual_clock_after_the_steps_that_were_ready_first(inline: InMemoryDispatcher) -> None:
    # Given one agent rate limited for 30 s on its first call, and another that is not
    model = CountingModel(script=ScriptConfig(faults=[Fault(turn=1, status=429, retry_after=30.0)]))
    limited = Agent(name=name("limited"), model=model)
    model_b = CountingModel(script=ScriptConfig(tool_batches=1))
    other = Agent(name=name("other"), model=model_b, tools=[lookup])
    inline.autorun = False
    a = limited.start("a").run_id
    b = other.start("b").run_id

    # When the queue is run
    began = time.monotonic()
    ran = inline.run_until_idle()

    # Then the other run's steps ran during the wait, the retry after them, and nobody slept
    assert ran == 5
    assert model.calls_for(a) == [0, 1] and model_b.calls_for(b) == [0, 2]
    order = [(s.run_id, s.seq) for s in inline.published]
    assert order == [(a, 0), (b, 0), (a, 1), (b, 1), (b, 2)]
    assert inline.published[2].countdown == 30.0
    assert inline.now == 30.0 and time.monotonic() - began < 30
    assert {inline.client.get_run(r).status for r in (a, b)} == {S.COMPLETED}


def test_a_failing_step_goes_to_the_failure_handler_which_keeps_its_messages_in_flight(
    inline: InMemoryDispatcher,
) -> None:
    # Given an agent allowed one tool batch whose model asks for a second
    model = CountingModel(script=ScriptConfig(tool_batches=2))
    agent = Agent(name=name("capped"), model=model, tools=[lookup], max_tool_batches=1)

    out = agent.run("otters")

    # Then the step failed as on a worker: ERROR, with the reply it paid for flushed onto the row
    assert out.status == S.ERROR and out.error is not None and out.error.type == "ToolBatchLimitError"
    assert [m.role for m in out.messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert out.messages[-1].tool_call_error and "was not run" in (out.messages[-1].content or "")


def test_with_autorun_off_steps_run_one_at_a_time_and_a_cancel_between_them_drops_the_rest(
    inline: InMemoryDispatcher,
) -> None:
    called: list[str] = []

    def record(query: str) -> str:
        """Record the query."""
        called.append(query)
        return "ok"

    agent = Agent(name=name("stepped"), model=CountingModel(), tools=[record])
    inline.autorun = False
    run_id = agent.start("otters").run_id
    assert [(s.kind, s.seq) for s in inline.pending] == [("model", 0)]

    step = inline.run_next()

    assert step == StepRef(run_id=run_id, seq=0, kind="model")
    assert [(s.kind, s.seq) for s in inline.pending] == [("tools", 1)]
    assert inline.client.cancel(run_id).status == S.CANCELLED
    assert inline.run_until_idle() == 1  # delivered, and dropped by the claim
    assert inline.run_next() is None
    assert called == [] and inline.client.get_run(run_id).status == S.CANCELLED


def test_in_memory_serves_agents_and_clients_of_its_settings_only_inside_the_block() -> None:
    agent = Agent(name=name("scoped"), model=CountingModel())

    with in_memory() as inline:
        assert agent.client is inline.client
        assert Client(inline.settings).dispatcher is inline
        assert agent.run("hi").status == S.COMPLETED
        database = Path(inline.store.engine.url.database or "")
        assert database.exists()

    assert agent.client is not inline.client
    assert not database.parent.exists()  # the temporary folder went with the block


def test_the_dispatcher_named_in_settings_makes_every_producer_run_inline(tmp_path: Path) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'runs.db'}", dispatcher="orchestrator.testing:InMemoryDispatcher"
    )
    agent = Agent(name=name("named"), model=CountingModel(), client=Client(settings))
    out = agent.run("hi", timeout=0)
    assert out.status == S.COMPLETED
    process = runtime.current(settings)
    assert isinstance(process.dispatcher, InMemoryDispatcher)
    assert process is process.dispatcher.runtime  # its producers share the runtime its steps run on
