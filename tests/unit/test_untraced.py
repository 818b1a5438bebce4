"""Tracing is optional: without OpenTelemetry, without a tracer provider, or with the SDK disabled,
runs work as before, nothing is recorded, no context is stored, and importing Ratchet loads none
of OpenTelemetry. The run's derived trace is a fixed function of its id (every host, every
release: traces of runs in flight across an upgrade must not split). Spans themselves are tested
on real steps in tests/integration/test_tracing.py and across workers in tests/chaos/test_tracing.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator import tracing

ROOT = Path(__file__).resolve().parents[2]

#: Runs an agent with a tool inline in a fresh process set up as `MODE` says, and prints what it saw.
SCRIPT = """
import json, os, sys
mode = os.environ["MODE"]
if mode == "absent":
    sys.modules["opentelemetry"] = None  # as if the package were not installed
import orchestrator, orchestrator.steps, orchestrator.control
loaded_at_import = sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m])
exporter = None
if mode == "disabled":  # OTEL_SDK_DISABLED=true: the application's provider records nothing
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
from orchestrator import Agent, tracing
from orchestrator.testing import in_memory
from orchestrator.testing.scripted_model import ScriptedModel

def lookup(city: str) -> str:
    '''Look a city up.'''
    return city

agent = Agent(name="untraced", model=ScriptedModel(), tools=[lookup])
with in_memory() as dispatcher:
    out = agent.run("hi")
    record = dispatcher.store.get_record(out.run_id)
print(json.dumps({
    "status": out.status.value, "roles": [m.role for m in out.messages], "active": tracing.active(),
    "trace_context": record.trace_context, "loaded_at_import": loaded_at_import,
    "spans": None if exporter is None else len(exporter.get_finished_spans()),
}))
"""


def run_untraced(mode: str) -> dict[str, Any]:
    env = {**os.environ, "MODE": mode, "PYTHONPATH": str(ROOT)}
    env.pop("OTEL_SDK_DISABLED", None)
    if mode == "disabled":
        env["OTEL_SDK_DISABLED"] = "true"
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    found: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize(
    "mode",
    [
        "absent",  # OpenTelemetry not installed
        "unset",  # installed, no tracer provider set
        "disabled",  # a provider set, with OTEL_SDK_DISABLED=true
    ],
)
def test_without_a_tracer_that_records_a_run_works_as_before_and_nothing_is_recorded_or_stored(mode: str) -> None:
    seen = run_untraced(mode)

    assert seen["status"] == "COMPLETED"
    assert seen["roles"] == ["user", "assistant", "tool", "assistant"]
    assert seen["active"] is False
    assert seen["trace_context"] is None  # its steps would derive their trace from the run id
    assert seen["loaded_at_import"] == []  # importing Ratchet costs nothing of OpenTelemetry's
    assert seen["spans"] == (0 if mode == "disabled" else None)


def test_a_run_s_derived_trace_is_a_fixed_function_of_its_id() -> None:
    run_id = "00000000-0000-4000-8000-000000000000"
    assert tracing.derived(run_id) == (0x44730E403A6C27B98430158624A26654, 0xA3DD4C06DB730367)
    record = SimpleNamespace(run_id=run_id, trace_context=None)
    assert tracing.run_context(record) == "00-44730e403a6c27b98430158624a26654-a3dd4c06db730367-01"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "not a traceparent",
        "00-00000000000000000000000000000000-a3dd4c06db730367-01",  # an invalid (zero) trace id
        "00-44730e403a6c27b98430158624a26654-0000000000000000-01",  # an invalid (zero) span id
        "01-44730e403a6c27b98430158624a26654-a3dd4c06db730367-01-extra",  # a version this does not read
    ],
)
def test_a_stored_context_that_is_no_valid_traceparent_gives_way_to_the_derived_one(stored: str) -> None:
    run_id = "r-1"
    trace_id, span_id = tracing.derived(run_id)
    record = SimpleNamespace(run_id=run_id, trace_context=stored)
    assert tracing.run_context(record) == f"00-{trace_id:032x}-{span_id:016x}-01"  # type: ignore[arg-type]


def test_a_valid_stored_context_is_the_run_s_parent_whose_trace_and_flags_it_keeps() -> None:
    stored = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"  # not sampled: the producer said so
    record = SimpleNamespace(run_id="r-1", trace_context=stored)
    span_id = tracing.derived("r-1")[1]
    assert tracing.run_context(record) == f"00-0af7651916cd43dd8448eb211c80319c-{span_id:016x}-00"  # type: ignore[arg-type]
    trace = tracing.run_trace(record)  # type: ignore[arg-type]
    assert (trace.parent_id, trace.stretch, trace.since) == (0xB7AD6B7169203331, 0, None)


@pytest.mark.parametrize("stored", [None, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"])
def test_each_continue_after_error_is_a_stretch_of_its_own_in_the_same_trace_under_the_same_parent(
    stored: str | None,
) -> None:
    record = SimpleNamespace(run_id="r-1", trace_context=stored)
    first = tracing.run_trace(record)  # type: ignore[arg-type]
    once = SimpleNamespace(run_id="r-1", trace_context=tracing.resumed(record, 1700000000.25))  # type: ignore[arg-type]
    twice = SimpleNamespace(run_id="r-1", trace_context=tracing.resumed(once, 1700000100.5))  # type: ignore[arg-type]
    second, third = tracing.run_trace(once), tracing.run_trace(twice)  # type: ignore[arg-type]

    assert first.trace_id == second.trace_id == third.trace_id
    assert first.parent_id == second.parent_id == third.parent_id
    assert len({first.span_id, second.span_id, third.span_id}) == 3
    assert [(t.stretch, t.since) for t in (first, second, third)] == [(0, None), (1, 1700000000.25), (2, 1700000100.5)]
    assert tracing.run_trace(SimpleNamespace(run_id="r-1", trace_context=twice.trace_context)) == third  # type: ignore[arg-type]


#: A fresh process that builds a runtime and logs a sweeper's line through a `%(trace_id)s`
#: format before any step: the line the API, a producer or the worker's main process writes.
LOG_SCRIPT = """
import logging, os, sys
if os.environ["MODE"] == "absent":
    sys.modules["opentelemetry"] = None
from orchestrator import runtime
from orchestrator.settings import Settings
handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(logging.Formatter("[%(trace_id)s|%(span_id)s] %(name)s %(message)s"))
logging.getLogger("ratchet").addHandler(handler)
runtime.build(Settings(database_url=os.environ["DB"], dispatcher="orchestrator.testing:InMemoryDispatcher"))
logging.getLogger("ratchet.sweeper").warning("swept %d", 3)
"""


@pytest.mark.parametrize("mode", ["absent", "unset"])
def test_a_ratchet_record_logged_before_any_step_formats_with_empty_trace_fields(mode: str, tmp_path: Path) -> None:
    env = {**os.environ, "MODE": mode, "PYTHONPATH": str(ROOT), "DB": f"sqlite:///{tmp_path / 'r.db'}"}
    result = subprocess.run([sys.executable, "-c", LOG_SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Logging error" not in result.stderr, result.stderr[-3000:]  # the format's KeyError, as logging reports it
    assert result.stdout.splitlines() == ["[|] ratchet.sweeper swept 3"]
