"""A run's own span, `invoke_agent {agent}` (OpenTelemetry's GenAI agent span), from its start to
its stop, across every task, worker and host its steps ran on.

No process holds it open: its ids are fixed when the run starts (`trace_context`), every step
names it as its parent, and the process whose write stops the run emits it whole, with the run's
times as its start and end (the store hands each committed stop to `stopped`). A stretch ends
at COMPLETED, ERROR or CANCELLED; a PAUSED run is waiting for a person inside its stretch, which
goes on when a decision resumes it. A continue after ERROR starts the next stretch, its own span,
linked to the one before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.status import RunStatus
from orchestrator.tracing import provider
from orchestrator.tracing.trace_context import agent_span_id, run_trace, set_error

if TYPE_CHECKING:
    from orchestrator.run import RunRecord

#: The stops that end a stretch (a PAUSED run's goes on once it is resumed).
ENDS = frozenset({RunStatus.COMPLETED, RunStatus.ERROR, RunStatus.CANCELLED})
_NS = 1_000_000_000


def stopped(record: RunRecord) -> None:
    """The run's move to `record.status` committed: where that ends its stretch, emit the
    stretch's `invoke_agent` span. Nothing where Ratchet records nothing, or with a tracer whose
    ids it cannot fix (not the OpenTelemetry SDK's)."""
    if record.status not in ENDS or provider.tracer() is None or not provider.pins_ids():
        return
    if record.status == RunStatus.CANCELLED and record.error_type is not None:
        return  # cancelled in ERROR (a cancel keeps the error, a continue clears it): the stretch ended then
    tracer, api = provider.found(), provider.api()
    assert tracer is not None
    trace = run_trace(record)
    if trace.parent_id is None:
        context = provider.context_api().Context()  # the trace's root: no current span is its parent
    else:
        parent = api.SpanContext(trace.trace_id, trace.parent_id, True, api.TraceFlags(trace.flags))
        context = api.set_span_in_context(api.NonRecordingSpan(parent))
    links = []
    if trace.stretch > 0:
        before = api.SpanContext(
            trace.trace_id, agent_span_id(record.run_id, trace.stretch - 1), True, api.TraceFlags(trace.flags)
        )
        links.append(api.Link(before, {"ratchet.link": "previous stretch"}))
    start = trace.since if trace.since is not None else record.created_at
    with provider.pinned(trace.trace_id, trace.span_id):
        span = tracer.start_span(
            f"invoke_agent {record.agent_name}",
            context=context,
            kind=api.SpanKind.INTERNAL,
            attributes=_attributes(record, trace.stretch),
            links=links,
            start_time=int(start * _NS),
            record_exception=False,
            set_status_on_exception=False,
        )
    if record.status == RunStatus.ERROR:
        set_error(span, record.error_type or "Error")
    span.end(end_time=int(max(record.updated_at, start) * _NS))


def _attributes(record: RunRecord, stretch: int) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": record.agent_name,
        "gen_ai.conversation.id": record.session_id,
        "ratchet.run_id": record.run_id,
        "ratchet.run.status": record.status.value,
        "ratchet.run.kind": record.kind,
    }
    if record.definition_hash is not None:
        attributes["gen_ai.agent.id"] = record.definition_hash
    if record.parent_run_id is not None:
        attributes["ratchet.parent_run_id"] = record.parent_run_id
    if record.forked_from is not None:
        attributes["ratchet.forked_from"] = record.forked_from
    if stretch:
        attributes["ratchet.run.stretch"] = stretch
    return attributes
