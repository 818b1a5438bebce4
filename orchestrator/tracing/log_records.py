"""The trace a log line of Ratchet's belongs to: every record of a `ratchet` logger made while a
span is current (a step's, a tool call's) carries `trace_id` and `span_id` (hex, as a traceparent
writes them; empty outside any span), for a formatter to print (`%(trace_id)s`, a JSON formatter's
fields) and for OpenTelemetry's own logging handler, which reads the current span itself.

Set on Python's log record factory where a process composes Ratchet (`runtime.build`, the
`ratchet` command, the Celery app) and again where it traces a step, so a record logged before
any step (a boot line, the sweeper's) has both too; records of other loggers are left as they are.
Each handler sees them, whichever its formatter.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from orchestrator.tracing import provider

_lock = threading.Lock()
_installed = False


def current_ids() -> tuple[str, str] | None:
    """The trace id and span id of the current span, in hex, if Ratchet traces and one is valid."""
    if provider.found() is None:
        return None
    context = provider.api().get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def install() -> None:
    """Stamp `trace_id` and `span_id` on the records of Ratchet's loggers from now on (once a process)."""
    global _installed
    if _installed:
        return
    with _lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def stamped(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if record.name == "ratchet" or record.name.startswith("ratchet."):
                record.trace_id, record.span_id = current_ids() or ("", "")
            return record

        logging.setLogRecordFactory(stamped)
        _installed = True
