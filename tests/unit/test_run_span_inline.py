"""A run's own span (`invoke_agent`) and its steps as messaging CONSUMER spans, on steps the
in-memory dispatcher runs: the run's span from its start to its stop, emitted by the process
whose write stopped it; a continue after ERROR as a second stretch; a pause inside its stretch;
a cancel; the queue wait; log records carrying the trace. Across worker processes, with Celery's
own instrumentation on: tests/chaos/test_tracing.py.

Ratchet's spans go to a provider of the test's own (`tracing.use_tracer_provider`): the process's
global provider is set once for good, and other tests must see Ratchet untraced."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from orchestrator import Agent, RunStatus, tool, tracing
from orchestrator.requirements import Decision
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import Clock, CountingModel

S = RunStatus
NS = 1_000_000_000


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)
    provider.shutdown()


def named(spans: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return sorted((s for s in spans.get_finished_spans() if s.name.startswith(prefix)), key=lambda s: s.start_time or 0)


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def lookup(city: str) -> str:
    """Look up the weather of a city."""
    logging.getLogger("ratchet.test").info("looking %s up", city)
    return f"{city}: sunny"


def agent_named(model: CountingModel, *tools: object) -> Agent:
    return Agent(name=f"spans-{uuid.uuid4().hex[:6]}", model=model, tools=list(tools))


def test_the_run_s_span_covers_it_from_start_to_stop_with_its_steps_as_consumer_spans_under_it(
    inline: InMemoryDispatcher, spans: InMemorySpanExporter
) -> None:
    # Given an agent whose model calls a tool once, then answers
    agent = agent_named(CountingModel(script=ScriptConfig(tool_batches=1)), lookup)

    # When it runs, traced, with nothing current where it starts
    out = agent.run("hi")
    record = inline.store.get_record(out.run_id)
    assert out.status == S.COMPLETED

    # Then the run's span is the root of its trace, from the run's creation to its stop
    (run,) = named(spans, f"invoke_agent {agent.name}")
    assert run.parent is None and run.kind == SpanKind.INTERNAL
    assert ids(run) == tracing.derived(out.run_id)  # fixed when it started: its id's hash
    assert (run.start_time, run.end_time) == (int(record.created_at * NS), int(record.updated_at * NS))
    assert dict(run.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent.name,
        "gen_ai.agent.id": record.definition_hash,
        "gen_ai.conversation.id": out.session_id,
        "ratchet.run_id": out.run_id,
        "ratchet.run.status": "COMPLETED",
        "ratchet.run.kind": "agent",
    }
    assert record.trace_context is None
    assert {s.context.trace_id for s in spans.get_finished_spans() if s.context} == {ids(run)[0]}

    # And its start, and each step, are its children: the steps CONSUMER spans of their queues
    (start,) = named(spans, "ratchet.start_run")
    assert parent_of(start) == ids(run)[1] and start.kind == SpanKind.PRODUCER
    steps = named(spans, "ratchet.step.")
    assert [s.name.split()[0] for s in steps] == ["ratchet.step.model", "ratchet.step.tools", "ratchet.step.model"]
    timeline = inline.client.get_steps(out.run_id)
    for step, queue, seen in zip(steps, ["ratchet.model", "ratchet.tools", "ratchet.model"], timeline, strict=True):
        attributes = dict(step.attributes or {})
        assert step.kind == SpanKind.CONSUMER and parent_of(step) == ids(run)[1]
        assert attributes["messaging.system"] == "inline" and attributes["messaging.destination.name"] == queue
        assert attributes["messaging.operation.type"] == "process"
        assert str(attributes["messaging.message.id"]).startswith(f"{out.run_id}.{attributes['ratchet.step.seq']}.")
        assert step.start_time == int((seen.started_at or 0) * NS)  # from the claim

    # And each step's wait in its queue, from its move to QUEUED to its claim, is a span beside it
    waits = named(spans, f"ratchet.queued {agent.name}")
    assert [w.attributes["ratchet.step.seq"] for w in waits] == [0, 1, 2]  # type: ignore[index]
    for wait, step in zip(waits, steps, strict=True):
        assert parent_of(wait) == ids(run)[1] and wait.end_time == step.start_time
        seconds = step.attributes["ratchet.step.queue_wait_seconds"]  # type: ignore[index]
        assert abs((wait.end_time - wait.start_time) / NS - seconds) < 1e-6  # type: ignore[operator]

    # And the model and tool calls are under their steps
    chats, (tool_span,) = named(spans, "chat "), named(spans, "execute_tool ")
    assert [parent_of(c) for c in chats] == [ids(steps[0])[1], ids(steps[2])[1]]
    assert parent_of(tool_span) == ids(steps[1])[1]


def test_a_run_continued_after_error_is_a_second_stretch_linked_to_the_first(
    inline: InMemoryDispatcher, spans: InMemorySpanExporter, clock: Clock
) -> None:
    # Given a run whose model refuses its key once: the run stops in ERROR
    agent = agent_named(CountingModel(script=ScriptConfig(tool_batches=0, faults=[Fault(status=401, times=1)])))
    out = agent.run("hi")
    assert out.status == S.ERROR
    (first,) = named(spans, "invoke_agent")
    assert first.status.status_code == StatusCode.ERROR and first.attributes["error.type"] == out.error.type  # type: ignore[union-attr,index]
    assert first.end_time == int(inline.store.get_record(out.run_id).updated_at * NS)

    # When it is continued in place and completes
    clock.advance(5)
    done = inline.client.continue_run(out.run_id).wait(timeout=0)
    assert done.status == S.COMPLETED and done.run_id == out.run_id

    # Then the continue began a second span of the run, in the same trace, linked to the first,
    # and the step that ran after it is its child
    first_again, second = named(spans, "invoke_agent")
    assert first_again.context == first.context and ids(second)[0] == ids(first)[0] and ids(second) != ids(first)
    assert second.attributes["ratchet.run.stretch"] == 1 and second.status.status_code == StatusCode.UNSET  # type: ignore[index]
    assert [link.context.span_id for link in second.links] == [ids(first)[1]]
    assert second.start_time is not None and first.end_time is not None and second.start_time >= first.end_time
    failed_step, last_step = named(spans, "ratchet.step.model")
    assert parent_of(failed_step) == ids(first)[1] and parent_of(last_step) == ids(second)[1]


def test_a_paused_run_s_span_goes_on_until_it_stops_after_the_decision_resumes_it(
    inline: InMemoryDispatcher, spans: InMemorySpanExporter, clock: Clock
) -> None:
    @tool(requires_confirmation=True)
    def pay(amount: int) -> str:
        """Pay.

        Args:
            amount: In cents.
        """
        return "paid"

    # Given a run paused for a person's confirmation
    agent = agent_named(CountingModel(), pay)
    out = agent.run("pay")
    assert out.status == S.PAUSED
    assert named(spans, "invoke_agent") == []  # waiting inside its stretch

    # When the person confirms a minute later and it completes
    clock.advance(60)
    (req,) = out.active_requirements
    inline.client.decide(out.run_id, req.id, Decision(kind="confirm"), by="ann")
    done = inline.client.get_run(out.run_id)
    assert done.status == S.COMPLETED

    # Then one span covers the run from its start, across the pause, to its stop
    (run,) = named(spans, "invoke_agent")
    record = inline.store.get_record(out.run_id)
    assert (run.start_time, run.end_time) == (int(record.created_at * NS), int(record.updated_at * NS))
    assert {parent_of(s) for s in named(spans, "ratchet.step.")} == {ids(run)[1]}


def test_a_cancel_ends_the_run_s_span_and_a_cancel_in_error_emits_none_again(
    inline: InMemoryDispatcher, spans: InMemorySpanExporter
) -> None:
    agent = agent_named(CountingModel(script=ScriptConfig(tool_batches=0, faults=[Fault(status=401, times=1)])))
    # A run cancelled before any step ran: its span ends with the cancel
    inline.autorun = False
    waiting = inline.client.start(agent.name, input="hi").run_id
    inline.client.cancel(waiting)
    (cancelled,) = named(spans, "invoke_agent")
    assert cancelled.attributes["ratchet.run.status"] == "CANCELLED"  # type: ignore[index]
    assert cancelled.status.status_code == StatusCode.UNSET
    inline.run_until_idle()  # its step is dropped: no span of its own

    # A run cancelled in ERROR: its span ended with the ERROR, and the cancel emits no second one
    inline.autorun = True
    failed = inline.client.start(agent.name, input="hi").wait(timeout=0)
    assert failed.status == S.ERROR
    inline.client.cancel(failed.run_id)
    assert [s.attributes["ratchet.run.status"] for s in named(spans, "invoke_agent")] == ["CANCELLED", "ERROR"]  # type: ignore[index]


def test_log_records_of_ratchet_s_loggers_carry_the_trace_and_span_of_the_step_that_made_them(
    inline: InMemoryDispatcher, spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture
) -> None:
    agent = agent_named(CountingModel(script=ScriptConfig(tool_batches=1)), lookup)
    with caplog.at_level(logging.INFO, logger="ratchet"):
        out = agent.run("hi")
        logging.getLogger("ratchet.test").info("after")
    assert out.status == S.COMPLETED

    (looked,) = [r for r in caplog.records if r.getMessage().startswith("looking")]
    (tool_span,) = named(spans, "execute_tool lookup")
    assert (looked.trace_id, looked.span_id) == (f"{ids(tool_span)[0]:032x}", f"{ids(tool_span)[1]:016x}")  # type: ignore[attr-defined]
    # Outside any span, a record of Ratchet's still has both, empty (a format naming them works)
    assert caplog.records[-1].getMessage() == "after"
    assert (caplog.records[-1].trace_id, caplog.records[-1].span_id) == ("", "")  # type: ignore[attr-defined]
