"""A run's place in its trace, from what its row stores (`ratchet_runs.trace_context`) and its id.

What is stored is the run's *parent*: the W3C traceparent of the span current where it was
started (an HTTP request's, the leader's step that delegated to a member), or nothing (then its
trace id is derived from its run id). A continue after ERROR appends the stretch it starts and
when (`;stretch=N@SECONDS`). Every other id is derived, the same on every host: the run's own
span (`invoke_agent`), which its steps are children of, has a span id hashed from the run id and
the stretch, so no process needs to have seen another's spans to name it.
"""

from __future__ import annotations

import hashlib
import re
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from orchestrator.tracing import provider

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from orchestrator.run import RunRecord

_STORED = re.compile(
    r"(?:00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2}))?(?:;stretch=([1-9][0-9]{0,8})@([0-9.]{1,32}))?"
)


class RunTrace(NamedTuple):
    """Where a run's current stretch sits in its trace."""

    trace_id: int
    #: The span id of the run's `invoke_agent` span for this stretch.
    span_id: int
    flags: int
    #: The span id of its parent (the producer's span), None: the run's span is the trace's root.
    parent_id: int | None
    #: 0 from the start; N after the Nth continue after ERROR.
    stretch: int
    #: When the stretch began (None: the run's creation).
    since: float | None


def derived(run_id: str) -> tuple[int, int]:
    """The trace id of a run stored without a parent, and the span id of its `invoke_agent` span:
    a hash of its id, the same on every host and in every Python (`hash()` is neither)."""
    digest = hashlib.sha256(f"ratchet.run:{run_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def agent_span_id(run_id: str, stretch: int) -> int:
    """The span id of the run's `invoke_agent` span in `stretch`."""
    if stretch == 0:
        return derived(run_id)[1]
    digest = hashlib.sha256(f"ratchet.run:{run_id}:{stretch}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def run_trace(record: RunRecord) -> RunTrace:
    """The run's trace as its row says (a stored value that is no valid context gives way to the
    derived one)."""
    return trace_of(record.run_id, record.trace_context)


def trace_of(run_id: str, stored: str | None) -> RunTrace:
    """`run_trace` from a run's id and its stored context."""
    found = _STORED.fullmatch(stored or "")
    stretch, since = 0, None
    if found is not None and found[4] is not None:
        try:
            stretch, since = int(found[4]), float(found[5])
        except ValueError:
            stretch, since = 0, None
    span_id = agent_span_id(run_id, stretch)
    if found is not None and found[1] is not None and int(found[1], 16) and int(found[2], 16):
        return RunTrace(int(found[1], 16), span_id, int(found[3], 16), int(found[2], 16), stretch, since)
    # Marked sampled: under the SDK's default sampler (ParentBased) every step of such a run is
    # recorded. A sampler deciding on the trace id alone (TraceIdRatioBased) decides alike on every host.
    return RunTrace(derived(run_id)[0], span_id, 1, None, stretch, since)


def run_context(record: RunRecord) -> str:
    """The traceparent of the run's `invoke_agent` span (its current stretch's): its steps' parent."""
    trace = run_trace(record)
    return traceparent(trace.trace_id, trace.span_id, trace.flags)


def traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """A W3C traceparent."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def resumed(record: RunRecord, now: float) -> str:
    """What a continue after ERROR stores: the run's parent as it was, and the stretch it starts
    now (its own `invoke_agent` span, begun at `now`)."""
    trace = run_trace(record)
    parent = traceparent(trace.trace_id, trace.parent_id, trace.flags) if trace.parent_id is not None else ""
    return f"{parent};stretch={trace.stretch + 1}@{now:.6f}"


def remote(trace: RunTrace) -> Any:
    """The run's span as a remote parent, in a context of its own (for `start_span(context=)`)."""
    api = provider.api()
    span = api.NonRecordingSpan(api.SpanContext(trace.trace_id, trace.span_id, True, api.TraceFlags(trace.flags)))
    return api.set_span_in_context(span)


def _current_traceparent() -> str | None:
    """The traceparent of the current span, if one is valid (even where Ratchet records nothing:
    the application's own provider may have made it)."""
    api = provider.api() if provider.api() is not None else provider.load()
    if not isinstance(api, ModuleType):
        return None
    span = api.get_current_span().get_span_context()
    return traceparent(span.trace_id, span.span_id, int(span.trace_flags)) if span.is_valid else None


# ---------------------------------------------------------------- a run's start


class Starting:
    """The span of a run's creation, entered around the write; `__enter__` returns the context
    to store with the run (see `starting`)."""

    def __init__(self, span: Span | None, stored: str | None) -> None:
        self._span = span
        self._stored = stored

    def __enter__(self) -> str | None:
        return self._stored

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._span is not None:
            if exc is not None:
                failed(self._span, exc)
            self._span.end()


def starting(
    agent_name: str, run_id: str, *, team: RunRecord | None = None, source: RunRecord | None = None
) -> Starting:
    """Around the write of a new run: the context to store with it (`with starting(...) as tc`):
    the current span, else for a member run its team's span, else none. Where spans are recorded,
    `ratchet.start_run {agent}` (a child of the new run's span) spans the write; `source`: the run
    a fork copies, linked."""
    stored = _current_traceparent()
    if stored is None and team is not None:
        stored = run_context(team)  # a member joins its team's trace whatever span is current
    tracer = provider.tracer()
    if tracer is None:
        return Starting(None, stored)
    api = provider.api()
    links = []
    if source is not None:
        linked = run_trace(source)
        links.append(api.Link(api.SpanContext(linked.trace_id, linked.span_id, True, api.TraceFlags(linked.flags))))
    attributes: dict[str, Any] = {"ratchet.run_id": run_id, "gen_ai.agent.name": agent_name}
    if team is not None:
        attributes["ratchet.parent_run_id"] = team.run_id
    span = tracer.start_span(
        f"ratchet.start_run {agent_name}",
        context=remote(trace_of(run_id, stored)),
        kind=api.SpanKind.PRODUCER,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    )
    return Starting(span, stored)


def failed(span: Span, exc: BaseException) -> None:
    """`span` failed with `exc`: a model error's kind is the provider's class of failure
    ("RateLimitError"); else the exception's type."""
    set_error(span, str(getattr(exc, "kind", None) or type(exc).__name__))


def set_error(span: Span, kind: str) -> None:
    """`span` in error, of `kind`."""
    api = provider.api()
    span.set_attribute("error.type", kind)
    span.set_status(api.Status(api.StatusCode.ERROR, kind))
