"""OpenTelemetry traces of runs, optional (`pip install 'ratchet-agents[otel]'`): one trace per run.

Ratchet uses the OpenTelemetry API only, and records nothing until the application sets a tracer
provider (`opentelemetry.trace.set_tracer_provider`, in every process that starts runs or runs
steps) or hands one to `use_tracer_provider`. Without the package, or without a provider, a step
pays one look at a module-level flag; the API is imported on first use, not with Ratchet.

- **The run's context.** A run is written with the W3C traceparent of a span of its producer
  (`ratchet_runs.trace_context`): where a tracer provider is set, Ratchet's own
  `ratchet.start_run {agent}` span, a child of whatever span is current (so a traced HTTP request
  that starts a run is the root of its trace); else the current span itself. A team's member run
  is written with the span of the leader's step that delegated to it (or the leader's own context
  where that worker traces nothing). A run written without one (its producer traced nothing, or
  it is older than migration 0009) has a context derived from its run id (`run_context`), which
  every worker on every host computes alike without a write.
- **A span per step** (`ratchet.step.model {agent}`, `ratchet.step.tools {agent}`), whose remote
  parent is the run's context: a step retried, or recovered by the sweeper on another host,
  joins the run's trace. Attributes: the run id, the step's kind, seq, attempt and epoch, the
  agent, the worker (the claim's owner, `host:pid:task`) and what the step did (`outcome`).
- **A span per tool call** (`execute_tool {tool}`) and **per model call** (`chat {model}`),
  children of their step's, with the attributes of OpenTelemetry's GenAI semantic conventions:
  operation, provider, request and response model, response id, finish reasons, token usage;
  a tool's name, type and call id. A failure sets the span's status and `error.type`.

What a span never holds: prompts, replies, tool arguments or results, and error messages (which
may quote any of them, or a database's parameters); never a key. A run's error is on the run,
whose id every span carries.
"""

from __future__ import annotations

import hashlib
import re
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any

from orchestrator.untrusted import TOOL_NAME_MAX, storable_name

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from orchestrator.messages import ToolCall
    from orchestrator.models.base import Model, ModelReply
    from orchestrator.run import RunRecord

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
#: The longest tool name a span's name takes (a model may call a tool by any name).
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

#: `opentelemetry.trace` once imported; False when it is not installed; None before the first look.
_api: ModuleType | bool | None = None
#: `opentelemetry.context`, imported with it.
_context: Any = None
#: The tracer spans are made with; None while no tracer provider is set.
_tracer: Tracer | None = None
#: Nothing is ever recorded in this process: the API is not installed, or the provider set
#: records nothing (OTEL_SDK_DISABLED).
_never = False
#: The provider given to `use_tracer_provider` (None: the global one).
_provider: TracerProvider | None = None


def use_tracer_provider(provider: TracerProvider | None) -> None:
    """Trace Ratchet with `provider` instead of OpenTelemetry's global one (None: the global one
    again), as instrumentations take `tracer_provider=`: for an application that keeps Ratchet's
    spans apart, and for tests."""
    global _provider, _tracer, _never
    _provider, _tracer, _never = provider, None, False


def active() -> bool:
    """Whether Ratchet records spans in this process now."""
    return _get_tracer() is not None


def flush(timeout_millis: int = 5000) -> None:
    """Export the spans the tracer provider still holds (a batch processor's), if Ratchet traced
    anything: for a process about to end without running exit handlers (a prefork pool process
    ends with `os._exit`)."""
    if _tracer is None:
        return
    provider = _provider if _provider is not None else _otel().get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(timeout_millis)


def _get_tracer() -> Tracer | None:
    """The tracer, or None when nothing is recorded. The hot path: a step calls it once."""
    if _tracer is not None or _never:
        return _tracer
    return _find_tracer()


def _find_tracer() -> Tracer | None:
    global _tracer, _never
    api = _api if _api is not None else _import()
    if not isinstance(api, ModuleType):
        _never = True
        return None
    provider = _provider if _provider is not None else api.get_tracer_provider()
    if isinstance(provider, api.ProxyTracerProvider | api.NoOpTracerProvider):
        return None  # none set yet: look again next time (a global provider is set once, for good)
    tracer = provider.get_tracer("ratchet")
    if isinstance(tracer, api.NoOpTracer):
        _never = True
        return None
    _tracer = tracer
    return tracer


def _import() -> ModuleType | bool:
    global _api, _context
    try:
        from opentelemetry import context, trace
    except ImportError:
        _api = False
    else:
        _api, _context = trace, context
    return _api


def _otel() -> Any:
    """`opentelemetry.trace` (only called once a tracer was found, or to read the current span)."""
    return _api


# ---------------------------------------------------------------- the run's context


def derived(run_id: str) -> tuple[int, int]:
    """The trace id and parent span id of a run stored without a context: a hash of its id,
    the same on every host and in every Python (`hash()` is neither)."""
    digest = hashlib.sha256(f"ratchet.run:{run_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def run_context(record: RunRecord) -> str:
    """The run's trace context as a traceparent: as stored, else derived from its run id."""
    trace_id, span_id, flags = _parsed(record)
    return _traceparent(trace_id, span_id, flags)


def _parsed(record: RunRecord) -> tuple[int, int, int]:
    found = _TRACEPARENT.fullmatch(record.trace_context or "")
    if found is not None and int(found[1], 16) and int(found[2], 16):
        return int(found[1], 16), int(found[2], 16), int(found[3], 16)
    # Marked sampled: under the SDK's default sampler (ParentBased) every step of such a run is
    # recorded. A sampler deciding on the trace id alone (TraceIdRatioBased) decides alike on every host.
    return (*derived(record.run_id), 1)


def _traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def _current_traceparent() -> str | None:
    """The traceparent of the current span, if one is valid (even where Ratchet records nothing:
    the application's own provider may have made it)."""
    api = _api if _api is not None else _import()
    if not isinstance(api, ModuleType):
        return None
    span = api.get_current_span().get_span_context()
    return _traceparent(span.trace_id, span.span_id, int(span.trace_flags)) if span.is_valid else None


class Starting:
    """The span of a run's creation, entered around the write; `__enter__` returns the context
    to store with the run (see `starting`)."""

    def __init__(self, span: Span | None, fallback: str | None) -> None:
        self._span = span
        self._fallback = fallback

    def __enter__(self) -> str | None:
        if self._span is None:
            return self._fallback
        context = self._span.get_span_context()
        return _traceparent(context.trace_id, context.span_id, int(context.trace_flags))

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._span is not None:
            if exc is not None:
                _failed(self._span, exc)
            self._span.end()


def starting(
    agent_name: str, run_id: str, *, team: RunRecord | None = None, source: RunRecord | None = None
) -> Starting:
    """Around the write of a new run: the context to store with it (`with starting(...) as tc`).
    `team`: the team of a member run (its context is the fallback); `source`: the run a fork
    copies (linked, where spans are recorded)."""
    tracer = _get_tracer()
    if tracer is None:
        # A member joins its team's trace whatever span is current (a task's, say).
        return Starting(None, run_context(team) if team is not None else _current_traceparent())
    api = _otel()
    links = []
    if source is not None:
        trace_id, span_id, flags = _parsed(source)
        links.append(api.Link(api.SpanContext(trace_id, span_id, True, api.TraceFlags(flags))))
    attributes: dict[str, Any] = {"ratchet.run_id": run_id, "gen_ai.agent.name": agent_name}
    if team is not None:
        attributes["ratchet.parent_run_id"] = team.run_id
    span = tracer.start_span(
        f"ratchet.start_run {agent_name}",
        kind=api.SpanKind.PRODUCER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    )
    return Starting(span, None)


# ---------------------------------------------------------------- spans of a step


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


class _Current:
    """A span made current for the block, and ended after it (as failed if the block raised)."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self._token: object = None

    def __enter__(self) -> _Current:
        self._token = _context.attach(_otel().set_span_in_context(self.span))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            _failed(self.span, exc)
        _context.detach(self._token)
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
        _set_error(self.span, kind)


Traced = _Current | _Off


def step(record: RunRecord, kind: str) -> Traced:
    """The span of a claimed step (`record`, as the claim left it), current for the block."""
    tracer = _get_tracer()
    if tracer is None:
        return OFF
    api = _otel()
    trace_id, span_id, flags = _parsed(record)
    remote = api.SpanContext(trace_id, span_id, True, api.TraceFlags(flags))
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
    }
    if record.parent_run_id is not None:
        attributes["ratchet.parent_run_id"] = record.parent_run_id
    span = tracer.start_span(
        f"ratchet.step.{kind} {record.agent_name}",
        context=api.set_span_in_context(api.NonRecordingSpan(remote)),
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    )
    return _Current(span)


def model_call(model: Model, record: RunRecord, *, stream: bool, structured: bool) -> Traced:
    """The span of one model call of the current step; `reply()` it the answer."""
    tracer = _tracer  # as the step found it: no second look for a provider
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
        kind=_otel().SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    )
    return _Current(span)


def tool_call(call: ToolCall, run_id: str) -> Traced:
    """The span of one tool call of the current step; `failed()` it a tool error."""
    tracer = _tracer  # as the step found it: no second look for a provider
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
    return _Current(span)


def _failed(span: Span, exc: BaseException) -> None:
    # A model error's kind is the provider's class of failure ("RateLimitError"); else the type.
    _set_error(span, str(getattr(exc, "kind", None) or type(exc).__name__))


def _set_error(span: Span, kind: str) -> None:
    api = _otel()
    span.set_attribute("error.type", kind)
    span.set_status(api.Status(api.StatusCode.ERROR, kind))


__all__ = [
    "active",
    "derived",
    "flush",
    "model_call",
    "run_context",
    "starting",
    "step",
    "tool_call",
    "use_tracer_provider",
]
