"""The spans of a step: the step itself (a CONSUMER span with OpenTelemetry's messaging
attributes), the wait in its queue before it, and each tool call and model call in it (GenAI
conventions), each current for its block and ended after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from orchestrator.tracing import log_records, provider
from orchestrator.tracing.trace_context import RunTrace, failed, remote, run_trace, set_error, trace_of
from orchestrator.untrusted import TOOL_NAME_MAX, storable_name

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from orchestrator.messages import ToolCall
    from orchestrator.models.base import Model, ModelReply
    from orchestrator.ports import Delivery
    from orchestrator.run import RunRecord

#: The longest text a span attribute that the provider wrote gets.
_ATTRIBUTE_MAX = 256
#: `ModelReply.usage` keys and the GenAI attributes they become.
_USAGE = {
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "cached_tokens": "gen_ai.usage.cache_read.input_tokens",
    "cache_write_tokens": "gen_ai.usage.cache_creation.input_tokens",
    "reasoning_tokens": "gen_ai.usage.reasoning.output_tokens",
}
_NS = 1_000_000_000


class _Off:
    """What every span helper returns while nothing is recorded: a context manager doing nothing."""

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def outcome(self, text: str) -> None:
        """Ignored."""

    def reply(self, reply: ModelReply) -> None:
        """Ignored."""

    def failed(self, kind: str) -> None:
        """Ignored."""


OFF = _Off()


class Current:
    """A span made current for the block, and ended after it (as failed if the block raised)."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self._token: object = None

    def __enter__(self) -> Current:
        self._token = provider.context_api().attach(provider.api().set_span_in_context(self.span))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            failed(self.span, exc)
        provider.context_api().detach(self._token)
        self.span.end()

    def outcome(self, text: str) -> None:
        """What the step did: "completed", "tools", "retry", "model", "waiting"."""
        self.span.set_attribute("ratchet.step.outcome", text)

    def reply(self, reply: ModelReply) -> None:
        """The model's answer: its model, id, finish reason and usage (never its text)."""
        attributes: dict[str, Any] = {_USAGE[k]: v for k, v in reply.usage.items() if k in _USAGE}
        # The provider's words: escaped and bounded as the store takes them (a lone surrogate
        # would fail the exporter's encoding, and with it the batch of every run's spans).
        if reply.response_model:
            attributes["gen_ai.response.model"] = storable_name(reply.response_model, _ATTRIBUTE_MAX)
        if reply.response_id:
            attributes["gen_ai.response.id"] = storable_name(reply.response_id, _ATTRIBUTE_MAX)
        if reply.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [storable_name(reply.finish_reason, _ATTRIBUTE_MAX)]
        self.span.set_attributes(attributes)

    def failed(self, kind: str) -> None:
        """The call failed without raising (a tool's error is a result the model reads)."""
        set_error(self.span, kind)


Traced = Current | _Off


def step(record: RunRecord, kind: str, delivery: Delivery | None = None) -> Traced:
    """The span of a claimed step (`record`, as the claim left it), current for the block: a
    child of the run's span, or of the delivery's own span where its messaging instrumentation
    made one in the run's trace (`delivery.in_delivery_span`; one of another trace is linked)."""
    tracer = provider.tracer()
    if tracer is None:
        return OFF
    log_records.install()
    api = provider.api()
    trace = run_trace(record)
    attributes = _step_attributes(record, kind, delivery)
    context, links = remote(trace), []
    if delivery is not None and delivery.in_delivery_span:
        current = api.get_current_span().get_span_context()
        if current.is_valid and current.trace_id == trace.trace_id:
            context = None  # the current context: the delivery's span
        elif current.is_valid:
            links.append(api.Link(current))
    if record.queued_at is not None and record.updated_at >= record.queued_at:
        attributes["ratchet.step.queue_wait_seconds"] = round(record.updated_at - record.queued_at, 6)
        _queue_wait(tracer, trace, record, kind, delivery)
    span = tracer.start_span(
        f"ratchet.step.{kind} {record.agent_name}",
        context=context,
        kind=api.SpanKind.CONSUMER,
        attributes=attributes,
        links=links,
        start_time=int(record.updated_at * _NS),  # the claim's time: the wait before it is the queue's
        record_exception=False,
        set_status_on_exception=False,
    )
    return Current(span)


def _step_attributes(record: RunRecord, kind: str, delivery: Delivery | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "ratchet.run_id": record.run_id,
        "ratchet.step.kind": kind,
        "ratchet.step.seq": record.seq,
        "ratchet.step.attempt": record.attempts,
        "ratchet.step.epoch": record.epoch,
        "ratchet.step.retries": record.retries,
        "ratchet.worker": record.lease_owner or "",
        "gen_ai.agent.name": record.agent_name,
        "gen_ai.conversation.id": record.session_id,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
    }
    if record.parent_run_id is not None:
        attributes["ratchet.parent_run_id"] = record.parent_run_id
    if delivery is not None:
        attributes["messaging.system"] = delivery.system
        if delivery.queue is not None:
            attributes["messaging.destination.name"] = delivery.queue
        if delivery.message_id is not None:
            attributes["messaging.message.id"] = delivery.message_id
    return attributes


def _queue_wait(tracer: Any, trace: RunTrace, record: RunRecord, kind: str, delivery: Delivery | None) -> None:
    """The step's wait, from its move to QUEUED to its claim, as a span of its own beside it."""
    assert record.queued_at is not None
    attributes: dict[str, Any] = {
        "ratchet.run_id": record.run_id,
        "ratchet.step.kind": kind,
        "ratchet.step.seq": record.seq,
        "ratchet.step.attempt": record.attempts,
    }
    if delivery is not None and delivery.queue is not None:
        attributes["messaging.destination.name"] = delivery.queue
    span = tracer.start_span(
        f"ratchet.queued {record.agent_name}",
        context=remote(trace),
        attributes=attributes,
        start_time=int(record.queued_at * _NS),
    )
    span.end(end_time=int(record.updated_at * _NS))


def model_call(model: Model, record: RunRecord, *, stream: bool, structured: bool) -> Traced:
    """The span of one model call of the current step; `reply()` it the answer."""
    tracer = provider.found()  # as the step found it: no second look for a provider
    if tracer is None:
        return OFF
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model.id,
        "gen_ai.conversation.id": record.session_id,
        "gen_ai.agent.name": record.agent_name,
        "ratchet.run_id": record.run_id,
    }
    if model.provider is not None:
        # gen_ai.system is the name conventions before 1.37 gave it; backends still read it.
        attributes["gen_ai.provider.name"] = attributes["gen_ai.system"] = model.provider
    if stream:
        attributes["gen_ai.request.stream"] = True
    if structured:
        attributes["gen_ai.output.type"] = "json"
    attributes.update(model.span_attributes())
    span = tracer.start_span(
        f"chat {model.id}",
        kind=provider.api().SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    )
    return Current(span)


def tool_call(call: ToolCall, run_id: str) -> Traced:
    """The span of one tool call of the current step; `failed()` it a tool error."""
    tracer = provider.found()  # as the step found it: no second look for a provider
    if tracer is None:
        return OFF
    name = storable_name(call.name, TOOL_NAME_MAX)
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
        "ratchet.run_id": run_id,
    }
    span = tracer.start_span(
        f"execute_tool {name}", attributes=attributes, record_exception=False, set_status_on_exception=False
    )
    return Current(span)


@contextmanager
def publishing(run_id: str, stored: str | None, headers: dict[str, Any]) -> Iterator[None]:
    """Around the publish of a step of the run: the run's span is current, so a messaging
    instrumentation's span of the publish (Celery's `apply_async/<task>`) is its child, and its
    context goes into the message's `headers` (OpenTelemetry's propagators: a consumer's
    instrumentation puts its span of the delivery in the run's trace even where the publisher
    made none). Nothing while Ratchet records nothing."""
    if provider.tracer() is None:
        yield
        return
    token = provider.context_api().attach(remote(trace_of(run_id, stored)))
    try:
        from opentelemetry.propagate import inject

        inject(headers)
        yield
    finally:
        provider.context_api().detach(token)
