"""One trace per run across worker processes: a run whose worker is SIGKILLed mid-step, and
whose step the sweeper hands to another worker, is still one trace; so is a team and its member.

The workers (prefork) trace into files (`tests.chaos.traced`: an in-memory exporter per process,
dumped as JSON lines); the test process is a producer that does not trace Ratchet, whose own
span (an HTTP request's, say) is current when it starts the run.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from orchestrator import RunStatus, tracing
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.waiting import wait_until
from tests.chaos.agents import AGENT, calls
from tests.chaos.harness import SHORT_LEASE, Cluster
from tests.chaos.team_agents import RESEARCHER, TEAM
from tests.chaos.team_harness import delegate

pytestmark = pytest.mark.chaos
S = RunStatus
TRACED_APPS = ("tests.chaos.agents", "tests.chaos.team_agents", "tests.chaos.traced")
Span = dict[str, Any]


def read_spans(folder: Path) -> list[Span]:
    """Every span the worker processes wrote to `folder` (whole lines only: one may be mid-write)."""
    import json

    return [json.loads(line) for p in sorted(folder.glob("spans-*.jsonl")) for line in p.read_text().split("\n")[:-1]]


def wait_for_step(folder: Path, run_id: str, outcome: str) -> list[Span]:
    """The spans written once a step of `run_id` that ended with `outcome` is among them (a step's
    span ends after its commit: the run can be final before it is written)."""

    def found() -> list[Span] | None:
        spans = read_spans(folder)
        done = any(of(s, run_id) and s["attributes"].get("ratchet.step.outcome") == outcome for s in spans)
        return spans if done else None

    spans: list[Span] = wait_until(found, timeout=20, what=f"the {outcome} step span of run {run_id}")
    return spans


def of(span: Span, *run_ids: str) -> bool:
    return span["attributes"].get("ratchet.run_id") in run_ids


def named(spans: list[Span], prefix: str) -> list[Span]:
    return [s for s in spans if s["name"].startswith(prefix)]


def test_a_run_recovered_on_another_worker_after_a_sigkill_and_a_team_are_each_one_trace(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(**SHORT_LEASE)
    folder = tmp_path / "spans"
    folder.mkdir()
    # Given two traced workers, and a run whose tool batch holds in b once a finished
    cluster.script(
        batches=[calls("a", "b")],
        by_model={
            "leader": ScriptConfig(batches=[[delegate(RESEARCHER, "research otters")]], final_text="T({tool_results})"),
            "researcher": ScriptConfig(batches=[calls("r1")], final_text="R({tool_results})"),
        },
    )
    cluster.flag("hold-b")
    with ThreadPoolExecutor(2) as starting:  # both start at once: a worker takes seconds to start
        workers = list(
            starting.map(lambda _: cluster.start_worker(apps=TRACED_APPS, env={"SPANS_DIR": str(folder)}), range(2))
        )
    cluster.start_sweeper()
    with TracerProvider().get_tracer("the-app").start_as_current_span("POST /runs") as request:
        run_id = cluster.start_run()
    pid = cluster.wait_tool_started("b")
    wait_until(lambda: len(cluster.store.get_output(run_id).tools) == 1, timeout=20, what="a's result to commit")

    # When the worker whose process runs the batch is SIGKILLed, and the sweeper hands the step on
    (killed,) = [w for w in workers if w.pid == os.getpgid(pid)]
    killed.kill()
    cluster.unflag("hold-b")
    out = cluster.assert_invariants([run_id])[run_id]
    assert out.status == S.COMPLETED and cluster.attempts(run_id) == {"a": 1, "b": 2}
    spans = wait_for_step(folder, run_id, "completed")

    # Then every span of the run, from both workers and both attempts, is in the request's trace
    spans = wait_until(
        lambda: (found := read_spans(folder)) and named([s for s in found if of(s, run_id)], "invoke_agent") and found,
        timeout=20,
        what="the run's span",
    )
    request_context = request.get_span_context()
    trace_id, request_id = f"{request_context.trace_id:032x}", f"{request_context.span_id:016x}"
    in_trace = [s for s in spans if s["trace_id"] == trace_id]
    assert in_trace == [s for s in spans if of(s, run_id)]
    (run,) = named(in_trace, "invoke_agent")  # the run's span, a child of the request
    assert run["parent_id"] == request_id and run["span_id"] == f"{tracing.derived(run_id)[1]:016x}"
    steps = named(in_trace, "ratchet.step.")
    assert all(s["parent_id"] == run["span_id"] and s["parent_remote"] for s in steps)
    # The killed attempt's step span never ended; its finished tool call's span did, in the killed process
    assert sorted((s["attributes"]["ratchet.step.seq"], s["attributes"]["ratchet.step.attempt"]) for s in steps) == [
        (0, 1), (1, 2), (2, 1),
    ]  # fmt: skip
    (recovered,) = [s for s in steps if s["attributes"]["ratchet.step.seq"] == 1]
    assert recovered["pid"] != pid and f":{pid}:" not in recovered["attributes"]["ratchet.worker"]
    key_of = {t.tool_call_id: (t.tool_args or {})["key"] for t in out.tools}
    tool_spans = {key_of[s["attributes"]["gen_ai.tool.call.id"]]: s for s in named(in_trace, "execute_tool effect")}
    assert set(tool_spans) == {"a", "b"}
    assert tool_spans["a"]["pid"] == pid and tool_spans["a"]["parent_id"] not in {s["span_id"] for s in spans}
    assert tool_spans["b"]["parent_id"] == recovered["span_id"] and tool_spans["b"]["pid"] == recovered["pid"]
    assert all(s["attributes"]["gen_ai.operation.name"] == "execute_tool" for s in tool_spans.values())

    # And each model call is a child of its step, with the GenAI attributes and the run's tokens
    model_steps = {s["span_id"] for s in steps if s["attributes"]["ratchet.step.kind"] == "model"}
    chats = named(in_trace, "chat scripted")
    assert len(chats) == 2 and {c["parent_id"] for c in chats} == model_steps
    for chat in chats:
        attributes = chat["attributes"]
        assert chat["kind"] == "CLIENT" and attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.provider.name"] == "openai" and attributes["gen_ai.agent.name"] == AGENT
        assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == "scripted"
    assert sorted(c["attributes"]["gen_ai.response.finish_reasons"][0] for c in chats) == ["stop", "tool_calls"]
    assert sum(c["attributes"]["gen_ai.usage.input_tokens"] for c in chats) == out.metrics.input_tokens
    assert sum(c["attributes"]["gen_ai.usage.output_tokens"] for c in chats) == out.metrics.output_tokens

    # And a team started with no span current is one trace, derived from its run id, that holds
    # its member's spans under the leader's step that delegated
    team_run_id = cluster.client.start(TEAM, input="otters").run_id
    team = cluster.wait_final([team_run_id])[team_run_id]
    assert team.status == S.COMPLETED, cluster.diagnose([team_run_id])
    (member,) = team.member_runs
    wait_for_step(folder, member.run_id, "completed")
    spans = wait_for_step(folder, team_run_id, "completed")
    team_spans = [s for s in spans if of(s, team_run_id, member.run_id)]
    assert {s["trace_id"] for s in team_spans} == {f"{tracing.derived(team_run_id)[0]:032x}"}
    (delegating,) = [s for s in named(team_spans, f"ratchet.step.tools {TEAM}")]
    (member_run,) = [s for s in named(spans, f"invoke_agent {RESEARCHER}") if of(s, member.run_id)]
    (member_start,) = [s for s in named(spans, f"ratchet.start_run {RESEARCHER}") if of(s, member.run_id)]
    assert member_run["parent_id"] == delegating["span_id"] and member_run["trace_id"] == delegating["trace_id"]
    assert member_start["parent_id"] == member_run["span_id"]
    member_steps = named(team_spans, f"ratchet.step.model {RESEARCHER}")
    assert len(member_steps) == 2 and all(s["parent_id"] == member_run["span_id"] for s in member_steps)
    assert cluster.store.get_record(member.run_id).trace_context == (
        f"00-{delegating['trace_id']}-{delegating['span_id']}-{delegating['flags']}"
    )


@pytest.mark.parametrize("chaos_db", ["sqlite"], indirect=True)  # a pool process's exit, not the store
def test_spans_a_batch_processor_holds_are_exported_when_a_pool_process_ends(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster()
    folder = tmp_path / "spans"
    folder.mkdir()
    # Given a prefork worker whose spans wait in a batch processor, and a run it completed
    cluster.script(batches=[calls("x")])
    worker = cluster.start_worker(apps=TRACED_APPS, env={"SPANS_DIR": str(folder), "SPANS_BATCH": "1"})
    run_id = cluster.start_run()
    assert cluster.wait_final([run_id])[run_id].status == S.COMPLETED
    assert read_spans(folder) == []  # held

    # When the worker stops warm, and its pool processes end (with os._exit, no exit handlers)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(30) == 0

    # Then every span of the run was exported first
    steps = [s for s in named(read_spans(folder), "ratchet.step.") if of(s, run_id)]
    assert sorted(s["attributes"]["ratchet.step.seq"] for s in steps) == [0, 1, 2]


def read_logs(folder: Path) -> list[dict[str, Any]]:
    """Every log record the worker processes wrote to `folder` (whole lines only)."""
    import json

    return [json.loads(line) for p in sorted(folder.glob("logs-*.jsonl")) for line in p.read_text().split("\n")[:-1]]


@pytest.mark.parametrize("chaos_db", ["sqlite"], indirect=True)  # how spans combine, not the store
def test_with_celery_s_instrumentation_on_a_run_is_one_trace_each_step_a_child_of_celery_s_span_of_its_task(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster()
    folder = tmp_path / "spans"
    folder.mkdir()
    # Given a worker traced by Ratchet and by OpenTelemetry's Celery instrumentation, logging
    # Ratchet's records as JSON, and a run whose first model call is retried once, then calls a tool
    cluster.script(batches=[calls("x")], faults=[Fault(status=429, times=1)])
    env = {"SPANS_DIR": str(folder), "SPANS_CELERY": "1", "SPANS_LOGS": "1"}
    cluster.start_worker(apps=TRACED_APPS, env=env)

    # When a producer that traces Ratchet (and not Celery) starts it
    exporter = InMemorySpanExporter()
    producer = TracerProvider()
    producer.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_tracer_provider(producer)
    try:
        run_id = cluster.start_run()
    finally:
        tracing.use_tracer_provider(None)
    assert cluster.wait_final([run_id])[run_id].status == S.COMPLETED
    spans = wait_until(
        lambda: (found := read_spans(folder)) and named([s for s in found if of(s, run_id)], "invoke_agent") and found,
        timeout=20,
        what="the run's span",
    )

    # Then the run's span, emitted by the worker that stopped it, roots one trace
    trace_id, run_span = (f"{n:0{w}x}" for n, w in zip(tracing.derived(run_id), (32, 16), strict=True))
    (run,) = named(spans, "invoke_agent")
    assert run["span_id"] == run_span and run["parent_id"] is None and run["trace_id"] == trace_id
    (start,) = [s for s in exporter.get_finished_spans() if s.name.startswith("ratchet.start_run")]
    assert f"{start.parent.span_id:016x}" == run_span  # type: ignore[union-attr]
    assert {s["trace_id"] for s in spans} == {trace_id}  # Celery's spans too: no second tree

    # And each step is a CONSUMER span under Celery's span of its task (the same message id),
    # whose parent is the run's span: through the producer's headers for the first task, through
    # Celery's publish span (itself the run span's child) for the tasks a worker published
    by_id = {s["span_id"]: s for s in spans}
    steps = sorted(named(spans, "ratchet.step."), key=lambda s: s["start"])
    assert [s["attributes"]["ratchet.step.outcome"] for s in steps] == ["retry", "tools", "model", "completed"]
    for step in steps:
        celery_run = by_id[step["parent_id"]]
        assert step["kind"] == "CONSUMER" and celery_run["kind"] == "CONSUMER"
        assert celery_run["name"] == f"run/ratchet.{'model_call' if 'model' in step['name'] else 'tool_batch'}"
        message_id = step["attributes"]["messaging.message.id"]
        assert celery_run["attributes"]["messaging.message.id"] == message_id
        assert step["attributes"]["messaging.system"] == "celery"
        queue = cluster.settings.model_queue if "model" in step["name"] else cluster.settings.tools_queue
        assert step["attributes"]["messaging.destination.name"] == queue
        above = by_id.get(celery_run["parent_id"], {"span_id": celery_run["parent_id"]})
        if above["span_id"] != run_span:
            assert above["name"].startswith("apply_async/") and above["parent_id"] == run_span
    assert by_id.get(steps[0]["parent_id"], {}).get("parent_id") == run_span  # the producer's headers

    # And the wait in the queue before each step is a span beside it, under the run's span
    waits = sorted(named(spans, "ratchet.queued"), key=lambda s: s["start"])
    assert len(waits) == 4 and {w["parent_id"] for w in waits} == {run_span}
    assert all(w["end"] == s["start"] for w, s in zip(waits, steps, strict=True))

    # And the retried step's log line carries the trace and that step's span
    (retry_line,) = [r for r in read_logs(folder) if "retry 1" in r["message"] and run_id in r["message"]]
    assert (retry_line["trace_id"], retry_line["span_id"]) == (trace_id, steps[0]["span_id"])
