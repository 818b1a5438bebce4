"""OpenTelemetry traces of runs, on the steps a worker runs (inline here, on SQLite and
PostgreSQL; across two worker processes and a recovery in tests/chaos/test_tracing.py): one trace
per run, rooted at the run's own span, a span per step, tool call and model call, the GenAI
conventions' attributes, and no text of the conversation in any span. The run's span across a
continue, a pause and a cancel: tests/unit/test_run_span_inline.py.

Ratchet's spans go to a provider of the test's own (`tracing.use_tracer_provider`): the
process's global provider is set once for good, and other tests must see Ratchet untraced."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from orchestrator import Agent, RunStatus, Team, tracing
from orchestrator.models import OpenAIChat
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.testing.server import ScriptedServer
from tests.conftest import TEST_KEY

S = RunStatus


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Ratchet traced into an in-memory exporter for the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(provider)
    yield exporter
    tracing.use_tracer_provider(None)
    provider.shutdown()


def named(spans: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    return sorted((s for s in spans.get_finished_spans() if s.name.startswith(prefix)), key=lambda s: s.start_time or 0)


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def traceparent(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-{span.context.trace_flags:02x}"


def lookup(city: str) -> str:
    """Look up the weather of a city."""
    return f"{city}: sunny"


def broken(city: str) -> str:
    """Fail, always."""
    raise ValueError(f"no weather for {city}")


def weather_agent() -> Agent:
    return Agent(name=f"traced-{uuid.uuid4().hex[:6]}", model=OpenAIChat(id="scripted"), tools=[lookup, broken])


def call(tool: str, city: str) -> dict[str, Any]:
    return {"tool": tool, "arguments": {"city": city}}


def test_a_run_is_one_trace_of_its_steps_tool_calls_and_model_calls_with_the_genai_attributes(
    db_url: str, scripted: ScriptedServer, spans: InMemorySpanExporter
) -> None:
    # Given an agent whose model calls three tools at once (one fails), then answers
    agent = weather_agent()
    scripted.configure(ScriptConfig(batches=[[call("lookup", "Oslo"), call("lookup", "Lima"), call("broken", "Rome")]]))

    # When it runs, traced
    with in_memory(db_url) as dispatcher:
        out = agent.run("What is the weather in Oslo?")
        record = dispatcher.store.get_record(out.run_id)
    assert out.status == S.COMPLETED, out.error

    # Then the run's own span is the root of one trace that every span of the run is in, and
    # its producer's span is its child
    (run,) = named(spans, f"invoke_agent {agent.name}")
    (start,) = named(spans, f"ratchet.start_run {agent.name}")
    assert run.parent is None and parent_id(start) == span_id(run) and start.kind == SpanKind.PRODUCER
    assert record.trace_context is None and tracing.run_context(record) == traceparent(run)
    assert {s.context.trace_id for s in spans.get_finished_spans() if s.context} == {run.context.trace_id}  # type: ignore[union-attr]

    # And each step is a span whose (remote) parent is the run's span, with the step's attributes
    first, last = named(spans, f"ratchet.step.model {agent.name}")
    (tools,) = named(spans, f"ratchet.step.tools {agent.name}")
    for step, seq, outcome in ((first, 0, "tools"), (tools, 1, "model"), (last, 2, "completed")):
        assert step.parent is not None and step.parent.is_remote and parent_id(step) == span_id(run)
        attributes = dict(step.attributes or {})
        assert attributes["ratchet.run_id"] == out.run_id and attributes["ratchet.step.seq"] == seq
        assert attributes["ratchet.step.attempt"] == 1 and attributes["ratchet.step.outcome"] == outcome
        assert attributes["gen_ai.agent.name"] == agent.name and attributes["gen_ai.conversation.id"] == out.session_id
        assert str(attributes["ratchet.worker"]).startswith(f"{socket.gethostname()}:")
        assert step.status.status_code == StatusCode.UNSET

    # And each model call is a child of its step, as the GenAI conventions name it
    chats = named(spans, "chat scripted")
    assert [parent_id(c) for c in chats] == [span_id(first), span_id(last)]
    for chat, reason in zip(chats, ("tool_calls", "stop"), strict=True):
        attributes = dict(chat.attributes or {})
        assert chat.kind == SpanKind.CLIENT
        assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.provider.name"] == "openai"
        assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == "scripted"
        assert str(attributes["gen_ai.response.id"]).startswith("chatcmpl")
        assert attributes["gen_ai.response.finish_reasons"] == (reason,)
        assert attributes["server.address"] == "127.0.0.1" and attributes["openai.api.type"] == "chat_completions"
    assert sum(int(c.attributes["gen_ai.usage.input_tokens"]) for c in chats) == out.metrics.input_tokens  # type: ignore[arg-type,index]
    assert sum(int(c.attributes["gen_ai.usage.output_tokens"]) for c in chats) == out.metrics.output_tokens  # type: ignore[arg-type,index]

    # And each tool call is a child of the tool step (run in threads), the failing one in error
    tool_spans = named(spans, "execute_tool ")
    assert {parent_id(t) for t in tool_spans} == {span_id(tools)}
    by_call = {t.attributes["gen_ai.tool.call.id"]: t for t in tool_spans}  # type: ignore[index]
    assert set(by_call) == {t.tool_call_id for t in out.tools}
    for execution in out.tools:
        tool_span = by_call[execution.tool_call_id]
        assert tool_span.name == f"execute_tool {execution.tool_name}"
        assert tool_span.attributes["gen_ai.operation.name"] == "execute_tool"  # type: ignore[index]
        assert tool_span.attributes["gen_ai.tool.name"] == execution.tool_name  # type: ignore[index]
        failed = tool_span.status.status_code == StatusCode.ERROR
        assert failed == execution.tool_call_error == (execution.tool_name == "broken")
        assert (tool_span.attributes or {}).get("error.type") == ("ValueError" if failed else None)

    # And no span holds the conversation's text or the key
    shown = repr([(s.name, dict(s.attributes or {}), s.status.description) for s in spans.get_finished_spans()])
    for secret in ("Oslo", "sunny", "no weather", TEST_KEY):
        assert secret not in shown


def test_a_span_current_when_a_run_starts_is_the_parent_of_its_trace(
    db_url: str, scripted: ScriptedServer, spans: InMemorySpanExporter
) -> None:
    agent = weather_agent()
    scripted.configure(ScriptConfig(tool_batches=0))
    tracer = TracerProvider().get_tracer("the-app")  # the application's own provider: not Ratchet's

    # When a run starts inside the application's span (an HTTP request's)
    with in_memory(db_url) as dispatcher:
        with tracer.start_as_current_span("POST /runs") as request:
            out = agent.run("hi")
        record = dispatcher.store.get_record(out.run_id)

    # Then the run's span is its child (the request is stored as the run's parent), and the
    # run's steps are in the request's trace
    (run,) = named(spans, "invoke_agent")
    (start,) = named(spans, "ratchet.start_run")
    assert parent_id(run) == request.get_span_context().span_id and parent_id(start) == span_id(run)
    assert record.trace_context == traceparent(request)  # type: ignore[arg-type]
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {request.get_span_context().trace_id}  # type: ignore[union-attr]


def test_a_run_started_where_ratchet_traces_nothing_stores_the_current_span_or_derives_its_trace(
    db_url: str, scripted: ScriptedServer, spans: InMemorySpanExporter
) -> None:
    agent = weather_agent()
    scripted.configure(ScriptConfig(tool_batches=0))
    tracer = TracerProvider().get_tracer("the-app")
    with in_memory(db_url, autorun=False) as dispatcher:
        # Given two runs started by a producer that does not trace Ratchet: one inside a span of
        # its own, one outside any span
        tracing.use_tracer_provider(None)
        assert not tracing.active()
        with tracer.start_as_current_span("POST /runs") as request:
            inside = dispatcher.client.start(agent.name, input="hi").run_id
        outside = dispatcher.client.start(agent.name, input="hi").run_id
        stored = {r: dispatcher.store.get_record(r).trace_context for r in (inside, outside)}

        # When workers that trace run their steps
        tracing.use_tracer_provider(_provider_of(spans))
        dispatcher.run_until_idle()

    # Then the first run's span is a child of the producer's span, which the run stores; the
    # second's is the root of the trace its run id gives, with the span id it gives; each run's
    # steps are children of its span, which the worker that stopped the run emitted
    context = request.get_span_context()
    assert stored == {
        inside: f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}",
        outside: None,
    }
    runs = {s.attributes["ratchet.run_id"]: s for s in named(spans, "invoke_agent")}  # type: ignore[index]
    steps = {s.attributes["ratchet.run_id"]: s for s in named(spans, "ratchet.step.model")}  # type: ignore[index]
    assert runs[inside].context.trace_id == context.trace_id and parent_id(runs[inside]) == context.span_id  # type: ignore[union-attr]
    assert parent_id(steps[inside]) == span_id(runs[inside]) == tracing.derived(inside)[1]
    trace_id, run_span = tracing.derived(outside)
    assert runs[outside].parent is None and (runs[outside].context.trace_id, span_id(runs[outside])) == (  # type: ignore[union-attr]
        trace_id,
        run_span,
    )
    assert steps[outside].context.trace_id == trace_id and parent_id(steps[outside]) == run_span  # type: ignore[union-attr]


def _provider_of(spans: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider


def test_a_member_run_is_in_its_team_s_trace_under_the_leader_s_step_that_delegated(
    db_url: str, spans: InMemorySpanExporter
) -> None:
    tag = uuid.uuid4().hex[:6]
    researcher = Agent(
        name=f"researcher-{tag}", model=ScriptedModel(script=ScriptConfig(tool_batches=0)), role="Finds facts."
    )
    leader = ScriptedModel(
        script=ScriptConfig(
            batches=[[{"tool": TO_MEMBER, "arguments": {"member_id": member_id(researcher), "task": "t"}}]]
        )
    )
    team = Team(name=f"team-{tag}", model=leader, members=[researcher])

    with in_memory(db_url):
        out = team.run("otters")
    assert out.status == S.COMPLETED, out.error
    (member,) = out.member_runs

    # The team's span roots one trace holding the leader's and the member's spans: the member's
    # own span is a child of the leader's step that delegated, and its steps are its children
    (root,) = named(spans, f"invoke_agent {team.name}")
    assert root.parent is None and root.attributes["ratchet.run.kind"] == "team"  # type: ignore[index]
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {root.context.trace_id}  # type: ignore[union-attr]
    (delegating,) = named(spans, f"ratchet.step.tools {team.name}")
    assert parent_id(delegating) == span_id(root)
    (member_run,) = named(spans, f"invoke_agent {researcher.name}")
    (member_start,) = named(spans, f"ratchet.start_run {researcher.name}")
    assert parent_id(member_run) == span_id(delegating) and parent_id(member_start) == span_id(member_run)
    assert member_start.attributes["ratchet.parent_run_id"] == out.run_id  # type: ignore[index]
    assert member_run.attributes["ratchet.parent_run_id"] == out.run_id  # type: ignore[index]
    (member_step,) = named(spans, f"ratchet.step.model {researcher.name}")
    assert parent_id(member_step) == span_id(member_run)
    assert member_step.attributes["ratchet.run_id"] == member.run_id  # type: ignore[index]
    # A ScriptedModel names no provider: the attribute is left out rather than guessed
    assert all("gen_ai.provider.name" not in (c.attributes or {}) for c in named(spans, "chat "))


def test_a_failed_model_call_is_a_chat_span_in_error_and_its_step_a_retry(
    db_url: str, scripted: ScriptedServer, spans: InMemorySpanExporter
) -> None:
    agent = weather_agent()
    scripted.configure(ScriptConfig(tool_batches=0, faults=[Fault(status=429, times=1)]))

    with in_memory(db_url):
        out = agent.run("hi")
    assert out.status == S.COMPLETED, out.error

    failed, answered = named(spans, "chat scripted")
    assert failed.status.status_code == StatusCode.ERROR and failed.attributes["error.type"] == "RateLimitError"  # type: ignore[index]
    assert answered.status.status_code == StatusCode.UNSET
    retry, done = named(spans, "ratchet.step.model")
    assert (retry.attributes["ratchet.step.outcome"], done.attributes["ratchet.step.outcome"]) == ("retry", "completed")  # type: ignore[index]
    assert retry.status.status_code == StatusCode.UNSET  # the step did its work: it parked the retry


def test_a_fork_is_a_trace_of_its_own_whose_start_links_to_the_run_it_copies(
    db_url: str, scripted: ScriptedServer, spans: InMemorySpanExporter
) -> None:
    agent = weather_agent()
    scripted.configure(ScriptConfig(tool_batches=0))
    with in_memory(db_url) as dispatcher:
        source = agent.run("hi")
        fork = dispatcher.client.continue_run(source.run_id, input="and then?").wait(timeout=0)
        stored = dispatcher.store.get_record(source.run_id).trace_context
    assert fork.status == S.COMPLETED and fork.run_id != source.run_id

    first, second = named(spans, "ratchet.start_run")
    assert second.attributes["ratchet.run_id"] == fork.run_id  # type: ignore[index]
    assert second.context.trace_id != first.context.trace_id  # type: ignore[union-attr]
    source_run, fork_run = named(spans, "invoke_agent")
    assert stored is None and fork_run.attributes["ratchet.forked_from"] == source.run_id  # type: ignore[index]
    (link,) = second.links  # to the span of the run it copies
    assert (link.context.trace_id, link.context.span_id) == (source_run.context.trace_id, span_id(source_run))  # type: ignore[union-attr]
    (fork_step,) = [s for s in named(spans, "ratchet.step.model") if s.attributes["ratchet.run_id"] == fork.run_id]  # type: ignore[index]
    assert parent_id(fork_step) == span_id(fork_run) and parent_id(second) == span_id(fork_run)


def test_a_streamed_responses_api_call_is_traced_as_a_whole_chat_completions_one_is(
    db_url: str, scripted: ScriptedServer, spans: InMemorySpanExporter
) -> None:
    from orchestrator.models import OpenAIResponses

    agent = Agent(name=f"traced-{uuid.uuid4().hex[:6]}", model=OpenAIResponses(id="scripted"), tools=[lookup])
    scripted.configure(ScriptConfig(batches=[[call("lookup", "Oslo")]]))
    with in_memory(db_url) as dispatcher:
        out = dispatcher.client.start(agent.name, input="hi", stream=True).wait(timeout=0)
    assert out.status == S.COMPLETED, out.error

    chats = named(spans, "chat scripted")
    for chat, reason in zip(chats, ("tool_calls", "stop"), strict=True):
        attributes = dict(chat.attributes or {})
        assert attributes["openai.api.type"] == "responses" and attributes["gen_ai.request.stream"] is True
        assert attributes["gen_ai.response.model"] == "scripted" and str(attributes["gen_ai.response.id"]).startswith(
            "resp"
        )
        assert attributes["gen_ai.response.finish_reasons"] == (reason,)
    assert sum(int(c.attributes["gen_ai.usage.output_tokens"]) for c in chats) == out.metrics.output_tokens  # type: ignore[arg-type,index]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_claude_call_is_a_chat_span_of_the_anthropic_provider_with_its_cache_counts(
    db_url: str, scripted: ScriptedServer, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.models import Claude
    from orchestrator.testing.anthropic_wire import anthropic_base_url

    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_base_url(scripted.url))
    monkeypatch.setenv("ANTHROPIC_API_KEY", TEST_KEY)
    scripted.configure(ScriptConfig(usage_fields={"cache_creation_input_tokens": 30, "cache_read_input_tokens": 5}))
    agent = Agent(name=f"traced-{uuid.uuid4().hex[:6]}", model=Claude(id="claude-x", top_k=3))
    with in_memory(db_url) as dispatcher:
        out = dispatcher.client.start(agent.name, input="hi").wait(timeout=0)
    assert out.status == S.COMPLETED, out.error

    (chat,) = named(spans, "chat claude-x")
    attributes = dict(chat.attributes or {})
    assert attributes["gen_ai.provider.name"] == "anthropic" and attributes["gen_ai.request.top_k"] == 3
    assert attributes["gen_ai.usage.cache_creation.input_tokens"] == 30
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 5
    assert attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert attributes["gen_ai.usage.input_tokens"] == out.metrics.input_tokens
