"""OpenTelemetry traces of runs, optional (`pip install 'ratchet-agents[otel]'`): one trace per run.

Ratchet uses the OpenTelemetry API only, and records nothing until the application sets a tracer
provider (`opentelemetry.trace.set_tracer_provider`, in every process that starts runs or runs
steps) or hands one to `use_tracer_provider`. Without the package, or without a provider, a step
pays one look at a module-level flag; the API is imported on first use, not with Ratchet.

- **The run's span** (`invoke_agent {agent}`, `agent_span.py`): the run from its start to its
  stop, in OpenTelemetry's GenAI conventions, emitted whole by the process whose write stops the
  run; its ids are fixed when it starts (`trace_context.py`), so every step names it as parent.
- **The run's context.** A run is written with the W3C traceparent of the span current where it
  was started (an HTTP request's; for a team's member run, the leader's step that delegated to
  it, or the team's span where that worker traces nothing): the run's span's parent. A run
  written without one has its trace id derived from its run id, which every worker on every host
  computes alike without a write. `ratchet.start_run {agent}` (PRODUCER) spans the write.
- **A span per step** (`ratchet.step.model {agent}`, `ratchet.step.tools {agent}`, CONSUMER,
  `step_spans.py`) with OpenTelemetry's messaging attributes, a child of the run's span (or of
  Celery's span of the delivery, with its instrumentation on); the wait in its queue before it
  (`ratchet.queued {agent}`); a step retried, or recovered by the sweeper on another host, joins
  the run's trace.
- **A span per tool call** (`execute_tool {tool}`) and **per model call** (`chat {model}`),
  children of their step's, with the attributes of OpenTelemetry's GenAI semantic conventions.
- **Log records** of Ratchet's loggers carry the current span's `trace_id` and `span_id`
  (`log_records.py`; both empty outside a span, from the process's first runtime on).

What a span never holds: prompts, replies, tool arguments or results, and error messages (which
may quote any of them, or a database's parameters); never a key. A run's error is on the run,
whose id every span carries.
"""

from __future__ import annotations

from orchestrator.tracing.agent_span import stopped
from orchestrator.tracing.log_records import current_ids
from orchestrator.tracing.log_records import install as stamp_log_records
from orchestrator.tracing.provider import active, available, flush, use_tracer_provider
from orchestrator.tracing.step_spans import OFF, Current, Traced, model_call, publishing, step, tool_call
from orchestrator.tracing.trace_context import derived, resumed, run_context, run_trace, starting

__all__ = [
    "OFF",
    "Current",
    "Traced",
    "active",
    "available",
    "current_ids",
    "derived",
    "flush",
    "model_call",
    "publishing",
    "resumed",
    "run_context",
    "run_trace",
    "stamp_log_records",
    "starting",
    "step",
    "stopped",
    "tool_call",
    "use_tracer_provider",
]
