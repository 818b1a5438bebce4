"""What the `ratchet` command prints: a run (`show`, `jsonable`), its log and steps, a page of runs
(`print_page`), and a run's events as they happen (`print_events`), text deltas inline as a chat
shows them."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from pydantic import TypeAdapter

from orchestrator.client import Client
from orchestrator.events import RunEvent
from orchestrator.requirements import RunRequirement
from orchestrator.run import LogEntry, RunOutput, RunPage
from orchestrator.timeline import Step
from orchestrator.usage import Metrics

_STEP = TypeAdapter(Step)
_RUN = TypeAdapter(RunOutput)


def show(
    out: RunOutput,
    indent: str = "",
    log: Callable[[str], list[LogEntry]] | None = None,
    steps: Callable[[str], list[Step]] | None = None,
) -> int:
    """Print the run, its messages and its member runs, and with `log` (a run's log by run_id)
    and `steps` (its steps) each one's; the exit status: 1 for ERROR, else 0."""
    user = f"  user={out.user_id}" if out.user_id is not None else ""
    print(terminal(f"{indent}run {out.run_id}  {out.status}  agent={out.agent_name}  session={out.session_id}{user}"))
    if out.parent_run_id:
        print(f"{indent}  member of {out.parent_run_id}")
    if out.forked_from:
        print(f"{indent}  forked from {out.forked_from}")
    if out.priority is not None:
        print(f"{indent}  priority {out.priority}")
    if out.deadline_at is not None:
        when = datetime.fromtimestamp(out.deadline_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        print(f"{indent}  deadline {when} (run_timeout {out.run_timeout or 0:g}s)")
    if out.definition_hash is not None:
        print(f"{indent}  definition {out.definition_hash[:12]}")
    if out.history_run_ids is not None:
        runs = ", ".join(out.history_run_ids) or "none yet"
        print(f"{indent}  history: {len(out.history_run_ids)} earlier run(s) of the session in its context: {runs}")
    if out.error:
        print(terminal(f"{indent}  error: {out.error}"))
    if out.retry:
        when = datetime.fromtimestamp(out.retry.until, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        left = max(0.0, out.retry.until - time.time())
        print(f"{indent}  waiting: retry {out.retry.attempt} at {when} (in {left:.0f}s) after {out.retry.reason}")
    print(f"{indent}  usage: {usage_line(out.metrics)}")
    for requirement in out.requirements:
        if requirement.member_run_id is None:  # a member's are shown with the member
            print(terminal(f"{indent}  {requirement_line(requirement)}"))
    if out.session_state and not indent:  # a member run shares its team's session
        print(terminal(f"  session state: {_line(json.dumps(out.session_state), 300)}"))
    if log is not None:
        entries = log(out.run_id)
        print(f"{indent}  log:{'' if entries else ' none'}")
        for entry in entries:
            print(terminal(f"{indent}    {log_line(entry)}"))
    if steps is not None:
        found = steps(out.run_id)
        print(f"{indent}  steps:{'' if found else ' none'}")
        for step in found:
            print(terminal(f"{indent}    {step_line(step)}"))
    for i, m in enumerate(out.messages):
        flag = " [tool_call_error]" if m.tool_call_error else ""
        calls = f" -> {', '.join(c.name for c in m.calls)}" if m.tool_calls else ""
        text = (m.content or "").replace("\n", " ")
        print(terminal(f"{indent}  [{i}] {m.role}{calls}: {text[:160]}{flag}"))
    for member in out.member_runs:
        show(member, indent + "    ", log, steps)
    return 0 if out.status != "ERROR" else 1


def jsonable(
    out: RunOutput,
    log: Callable[[str], list[LogEntry]] | None = None,
    steps: Callable[[str], list[Step]] | None = None,
) -> dict[str, Any]:
    """The run as JSON values, as the HTTP API answers it (its response model, `RunOutput`,
    dumped alike); with `log` and `steps`, each run's (and each member run's) too."""
    data: dict[str, Any] = _RUN.dump_python(out, mode="json")
    _add_records(out, data, log, steps)
    return data


def _add_records(
    out: RunOutput,
    data: dict[str, Any],
    log: Callable[[str], list[LogEntry]] | None,
    steps: Callable[[str], list[Step]] | None,
) -> None:
    if log is not None:
        data["log"] = [asdict(entry) for entry in log(out.run_id)]
    if steps is not None:
        data["steps"] = [_STEP.dump_python(step, mode="json") for step in steps(out.run_id)]
    for member, member_data in zip(out.member_runs, data["member_runs"], strict=True):
        _add_records(member, member_data, log, steps)


def requirement_line(r: RunRequirement) -> str:
    """One line for what a run asked of a person: waiting (and how to decide it), or decided."""
    call = r.tool_execution
    what = f"{call.tool_name}({_line(json.dumps(call.tool_args), 120)})" if call is not None else r.pause_type
    if r.status == "pending":
        return f"waiting for a person: {r.id}  {r.pause_type}  {what}  (ratchet pending)"
    decided = r.decision.describe() if r.decision is not None else r.status
    by = f" by {r.decided_by}" if r.decided_by else ""
    return f"{r.status}: {r.id}  {what}  {decided}{by}"


def log_line(entry: LogEntry) -> str:
    """One line for a log entry: when, what, at which step, and its particulars."""
    parts = [_when(entry.at), entry.kind, f"step {entry.seq}" if entry.seq is not None else "-"]
    for key, value in (entry.detail or {}).items():
        if isinstance(value, dict) and {"type", "message"} <= value.keys():
            value = f"{value['type']}: {_line(str(value['message']))}"
        elif isinstance(value, dict | list):
            value = json.dumps(value)
        parts.append(f"{key}={value}")
    return "  ".join(parts)


def step_line(step: Step) -> str:
    """One line for a step: its seq, task, status, attempt, duration, tokens, worker, the
    definition its worker ran it on, error."""
    took = f"{step.duration:.3f}s" if step.duration is not None else "-"
    parts = [f"step {step.seq}", step.task, step.status, f"attempt {step.attempt}", took]
    if step.metrics is not None:
        parts.append(f"tokens {_shown(step.metrics.input_tokens)}+{_shown(step.metrics.output_tokens)}")
    if step.tool_errors:
        parts.append(f"{step.tool_errors} tool error(s)")
    if step.worker is not None:
        parts.append(f"on {step.worker} task {step.task_id}")
    if step.model is not None:
        parts.append(f"model {step.model}")
    if step.definition_hash is not None:
        parts.append(f"definition {step.definition_hash[:12]}")
    for fallback in step.fallbacks:
        parts.append(f"fell back {fallback.failed_model} -> {fallback.model} ({fallback.error.type})")
    if step.error is not None:
        parts.append(f"{step.error.type}: {_line(step.error.message)}")
    if step.task == "decision":
        parts.append(f"asked {step.asked}, decided {len(step.decisions)}")
        parts += [f"{d.decision} by {d.by or 'an unnamed decider'} at {_when(d.at)}" for d in step.decisions]
    return "  ".join(parts)


def print_page(page: RunPage) -> None:
    """One line a run, newest first, then (on stderr) how to get the next page."""
    for run in page.runs:
        error = f"  {run.error.type}" if run.error else ""
        member = f"  member of {run.parent_run_id}" if run.parent_run_id else ""
        print(
            terminal(
                f"{run.run_id}  {run.status:<9}  {_when(run.created_at)}  agent={run.agent_name}  "
                f"session={run.session_id}{member}{error}"
            )
        )
    if not page.runs:
        print("no runs", file=sys.stderr)
    if page.next_cursor:
        print(f"more: add --cursor {page.next_cursor}", file=sys.stderr)


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def usage_line(metrics: Metrics) -> str:
    """Tokens and cost on one line, "unknown" where a count is (a call before usage was stored)."""

    return (
        f"input={_shown(metrics.input_tokens)} (cached {_shown(metrics.cache_read_tokens)})  "
        f"output={_shown(metrics.output_tokens)} (reasoning {_shown(metrics.reasoning_tokens)})  "
        f"total={_shown(metrics.total_tokens)}  cost={_shown(metrics.cost, '.6f')}"
    )


def _shown(value: float | None, spec: str = "d") -> str:
    return "unknown" if value is None else format(value, spec)


def print_events(
    client: Client, run_id: str, *, after: str | None = None, as_json: bool = False, timeout: float | None = None
) -> int:
    """Print the run's events until it stops (from the one after `after`), one line each, text
    deltas run together; `as_json`: one JSON object per line. The exit status is `show`'s."""
    inline = False  # the last thing printed was a delta: the next event starts a new line
    for event in client.stream(run_id, after=after, timeout=timeout):
        if as_json:
            print(json.dumps(event.model_dump(mode="json")), flush=True)
            continue
        if event.event == "RunContent":
            print(terminal(event.content or ""), end="", flush=True)
            inline = True
            continue
        print(("\n" if inline else "") + terminal(describe(event)), flush=True)
        inline = False
    return 1 if client.store.get_record(run_id).status == "ERROR" else 0


def describe(event: RunEvent) -> str:
    """One line for an event that is not a delta."""
    parts = [f"[{event.id}] {event.event}"]
    if event.tool is not None:
        args = json.dumps(event.tool.tool_args) if event.tool.tool_args is not None else ""
        parts.append(f"{event.tool.tool_name}({args})")
        if event.event == "ToolCallCompleted":
            parts.append(("error: " if event.tool.tool_call_error else "-> ") + _line(event.tool.result))
    if event.member_run_id is not None:
        parts.append(f"member {event.member_agent} {event.member_run_id}")
    if event.event == "FallbackModelActivated":
        parts.append(f"{event.failed_model} -> {event.model}")
    if event.error is not None:
        parts.append(f"{event.error.type}: {_line(event.error.message)}")
    if event.event in ("RunCompleted", "MemberRunCompleted") and event.content is not None:
        parts.append(_line(event.content))
    for req in event.requirements or ():
        parts.append(_asked(req))
    if event.requirement is not None:
        req = event.requirement
        decision = req.decision.describe() if req.decision is not None else "?"
        parts.append(f"{_asked(req)}: {decision} by {req.decided_by or 'an unnamed decider'}")
    if event.event == "StepRestarted":
        parts.append(f"step {event.seq} attempt {event.attempt}: drop its earlier partial text")
    return "  ".join(parts)


def _asked(req: RunRequirement) -> str:
    """A requirement in a few words: its id, what it asks, and the call it is about."""
    call = req.tool_execution
    what = f"{call.tool_name}({json.dumps(call.tool_args)})" if call is not None else json.dumps(req.budget)
    member = f" of member {req.member_agent_name}" if req.member_agent_name else ""
    return f"{req.pause_type} {req.id}{member} {_line(what)}"


#: Control characters but newline and tab: a model's text must not drive the reader's terminal.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal(text: str) -> str:
    """Untrusted text as a terminal may show it: control characters (ANSI escapes) written as
    `\\x1b`, and what stdout's encoding cannot hold (or a lone surrogate) backslash-escaped."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    encoding = sys.stdout.encoding or "utf-8"
    return text.encode(encoding, "backslashreplace").decode(encoding)


def _line(text: str | None, limit: int = 200) -> str:
    return (text or "").replace("\n", " ")[:limit]
