"""What an application does to trace its workers, as the tracing chaos test's workers do it
(`ratchet worker --app tests.chaos.agents --app tests.chaos.traced`): set a tracer provider when
the app module is imported.

The exporter is the test's in-memory one, made readable across processes: each span exported is
appended as one JSON line to `spans-<pid>.jsonl` in the folder SPANS_DIR names, one file per
process, written and closed at once. Spans are exported as each ends (a SIGKILL loses only the
spans not finished yet), or with SPANS_BATCH set, in batches, as production does.

Only worker processes import this module: importing it sets the process's global provider for
good (the test reads the files, see tests/chaos/test_tracing.py).

With SPANS_CELERY set, OpenTelemetry's Celery instrumentation is on too (`CeleryInstrumentor`,
its signal handlers connected here, before the pool forks, so every pool process has them), on
the same provider. With SPANS_LOGS set, every record of Ratchet's loggers from INFO up is
appended as one JSON line (its logger, its text, and the `trace_id` and `span_id` Ratchet stamps
on it) to `logs-<pid>.jsonl`: what a JSON log format prints.

A prefork pool forks its processes after this import, so each inherits the provider: a
SimpleSpanProcessor has no thread to lose in the fork, and a BatchSpanProcessor restarts its
own in the child (it registers an after-fork hook). An application that builds its provider
lazily instead does it in Celery's `worker_process_init`, in each pool process.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter, SpanExportResult

SPANS_DIR = "SPANS_DIR"
#: Set: spans go through a BatchSpanProcessor, which holds them until it is flushed.
SPANS_BATCH = "SPANS_BATCH"
#: Set: OpenTelemetry's Celery instrumentation traces the tasks too.
SPANS_CELERY = "SPANS_CELERY"
#: Set: Ratchet's log records are written as JSON lines.
SPANS_LOGS = "SPANS_LOGS"


def as_json(span: ReadableSpan) -> dict[str, Any]:
    """What the test reads of a span: ids in hex, as a traceparent writes them."""
    context, parent = span.context, span.parent
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "flags": f"{int(context.trace_flags):02x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "parent_remote": parent.is_remote if parent is not None else None,
        "kind": span.kind.name,
        "status": span.status.status_code.name,
        "attributes": {k: list(v) if isinstance(v, tuple) else v for k, v in (span.attributes or {}).items()},
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "start": span.start_time,
        "end": span.end_time,
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    """Appends each span to this process's file in SPANS_DIR."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        path = Path(os.environ[SPANS_DIR]) / f"spans-{os.getpid()}.jsonl"
        with path.open("a") as out:
            out.write("".join(json.dumps(as_json(s)) + "\n" for s in spans))
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing held open."""


provider = TracerProvider(resource=Resource.create({"service.name": "ratchet-chaos-worker"}))
if os.environ.get(SPANS_BATCH):
    # As production exports: in batches, here only when flushed (no timer, no full batch).
    provider.add_span_processor(BatchSpanProcessor(JsonLinesExporter(), schedule_delay_millis=3_600_000))
else:
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter()))
trace.set_tracer_provider(provider)


class JsonLinesLogs(logging.Handler):
    """Appends each record to this process's log file in SPANS_DIR, as a JSON formatter would."""

    def emit(self, record: logging.LogRecord) -> None:
        line = {
            "logger": record.name,
            "message": record.getMessage(),
            "trace_id": getattr(record, "trace_id", None),
            "span_id": getattr(record, "span_id", None),
        }
        with (Path(os.environ[SPANS_DIR]) / f"logs-{os.getpid()}.jsonl").open("a") as out:
            out.write(json.dumps(line) + "\n")


if os.environ.get(SPANS_CELERY):
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    CeleryInstrumentor().instrument(tracer_provider=provider)
if os.environ.get(SPANS_LOGS):
    ratchet_logs = logging.getLogger("ratchet")
    ratchet_logs.setLevel(logging.INFO)
    ratchet_logs.addHandler(JsonLinesLogs(logging.INFO))
