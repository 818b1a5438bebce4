"""A run's steps as a timeline (the web page's, `ratchet show --steps`, `Client.get_steps`),
derived from rows the store writes anyway: each message's seq, epoch and time, the run's log
(`ratchet_events`) and the run row. Nothing is written on a step's path for it.

What a step shows, and where it comes from:

- `task`: "model" (a model call) or "tools" (a tool batch), from what it wrote; "fan_in" for the
  results a team's fan-in wrote once its members ended (no worker ran it); "decision" for the
  wait for a person after a tool batch paused the run (no worker ran it either: it holds
  nothing), from the pause to the decision that resumed the run, with each decision (`decisions`:
  who, what, when) and how many calls it asked about (`asked`). A step that wrote nothing (it
  failed, or was retried) is a tools step if the transcript owed tool results then.
- `attempt`: 1, plus the claims of the same step the sweeper took back (`lease_expired`); the
  step in progress counts its claims from the run row. A transient model failure is retried as
  a new step (the next seq): the failed one shows as "retried", with its error.
- `ready_at`, `started_at`, `ended_at`, `duration`: a step could start (`ready_at`) when what
  came before it ended (the previous step, the run's creation, a continue, a fan-in, a retry's
  due time, a lease taken back, a pause, the decision that resumed the run). A step's commit
  stamps its claim's time on the messages it writes (migration 0010, for the metrics' step
  durations): where that is stored, `started_at`
  is the claim and `duration` runs from the claim to its last message; where it is not (rows
  older than 0010, a fan-in, a step that failed before writing), `duration` runs from
  `ready_at`, queue time included. A "decision" step's `duration` is the time to decision, from
  the pause to the resume (None while the run is PAUSED).
- `metrics`: the tokens and cost of its model call; `model`: the model that answered it, and
  `fallbacks`: the models of its agent's fallback chain it moved through before (each the model
  that failed, its error, and the model the step went on with), from the log's "fallback" entries.
- `worker`, `task_id`: only for the step in progress, from the lease (host:pid:task id); a
  commit clears the lease, so a past step's worker is not stored anywhere.
- `definition_hash`: the definition of its agent the worker that ran it served (the version of
  the code that ran it, beside the run's own `RunRecord.definition_hash`), stamped on every
  message the step wrote (migration 0025), or logged with its error; None for a step no worker
  ran (a fan-in, a decision), one in progress, and rows older than the stamp.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.messages import metrics_of
from orchestrator.run import LogEntry, RunError, RunRecord
from orchestrator.status import RunStatus
from orchestrator.usage import Metrics

S = RunStatus
Task = Literal["model", "tools", "fan_in", "decision"]
#: "paused": a "decision" step still waiting for a person.
StepStatus = Literal["done", "failed", "retried", "running", "queued", "paused"]
#: Log entries after which a step can start: when one of them is its latest, it is its `ready_at`.
_OPENS = ("continue", "retry", "fan_in", "lease_expired")


@dataclass(frozen=True, kw_only=True)
class StepDecision:
    """One decision a "decision" step got, as the run's log holds it."""

    #: The requirement's id.
    requirement: str
    #: Who decided it, as the decider named itself (None: unnamed).
    by: str | None
    #: What was decided, in a few words ("confirm", "reject ('note')", "input", "result", "budget").
    decision: str
    #: When (UNIX seconds).
    at: float


@dataclass(frozen=True, kw_only=True)
class StepFallback:
    """A model of a model step that failed for good, and the fallback model the step went on
    with (`orchestrator.models.fallback`), as the run's log holds it."""

    #: The model that failed, and the one the step went on with (their ids).
    failed_model: str
    model: str
    #: Why the first failed.
    error: RunError
    #: When (UNIX seconds).
    at: float


@dataclass(frozen=True, kw_only=True)
class Step:
    """One step of a run: a claim of (seq, task) by a worker, and what it wrote."""

    #: The run's step counter when it ran (a retry or a continue gets the next one).
    seq: int
    task: Task
    #: "done", "failed" (the run went to ERROR in it), "retried" (a transient model failure: the
    #: next step calls again), "running" (claimed now), "queued" (waiting for a worker).
    status: StepStatus
    #: 1, plus the claims of this step the sweeper took back from a worker that stopped.
    attempt: int
    #: The fencing epoch of the claim that wrote it (the `attempt` of its run events).
    epoch: int | None
    #: The index (among the stored messages: the system message not counted) of its first
    #: message, or where its first would go.
    position: int
    #: How many messages it wrote.
    messages: int = 0
    #: When it could start (UNIX seconds; see the module docstring).
    ready_at: float | None = None
    #: When it wrote its last message, or failed; None while it goes on.
    ended_at: float | None = None
    #: When its worker claimed it, where the commit stamped it (see the module docstring).
    started_at: float | None = None
    #: Seconds from `started_at` (else `ready_at`, queue time included) to `ended_at`.
    duration: float | None = None
    #: Its model call's tokens and cost (None for a tool batch, or when not reported).
    metrics: Metrics | None = None
    #: Its tool calls that failed.
    tool_errors: int = 0
    #: "host:pid" of the worker that holds it: the step in progress only.
    worker: str | None = None
    #: The Celery task id of its delivery: the step in progress only.
    task_id: str | None = None
    #: Why it failed or was retried.
    error: RunError | None = None
    #: A "decision" step's: how many requirements its pause asked, and the decisions in order.
    asked: int = 0
    decisions: tuple[StepDecision, ...] = ()
    #: A model step's: the model that wrote its reply, as its provider named it (None: none
    #: written, or a row older than migration 0017), and the fallbacks it took, in order.
    model: str | None = None
    fallbacks: tuple[StepFallback, ...] = ()
    #: The definition hash of the worker that ran it (see the module docstring; None: unknown).
    definition_hash: str | None = None


def derive_steps(record: RunRecord, rows: Sequence[Any], log: Sequence[LogEntry]) -> list[Step]:
    """The run's steps in order from its message rows (their stamps, not their content, in idx
    order: the store's `StepRows`), its log (oldest first) and its row. Built as dicts, each
    made a `Step` once at the end: a run of a thousand messages has hundreds of steps, and this
    is on the page's first load."""
    details = [(e, e.detail or {}) for e in log if e.seq is not None]
    continued = {(e.seq, d.get("epoch")) for e, d in details if e.kind == "continue"}
    fanned = {(e.seq, d.get("epoch")) for e, d in details if e.kind == "fan_in" or "member_run_id" in d}
    steps = [_written(group, fanned) for group in _groups(rows, continued)]
    for entry, detail in details:
        seq, at, where = int(entry.seq or 0), entry.at, _where(detail)
        if entry.kind == "error" and "member_run_id" not in detail:
            _failed(steps, rows, seq, at, detail)
        elif entry.kind in ("delegate", "paused") and "to" not in detail and all(s["seq"] != seq - 1 for s in steps):
            # the tool batch that delegated, or paused on every call, and wrote no result of its own
            steps.append(dict(seq=seq - 1, task="tools", status="done", ended_at=at, **where))
        elif entry.kind == "retry":
            error = _error(detail.get("error") or {})
            steps.append(dict(seq=seq - 1, task="model", status="retried", ended_at=at, error=error, **where))
    steps += _waits(record, details)
    _current(record, steps)
    _fell_back(steps, details)
    lost = Counter(e.seq for e, _ in details if e.kind == "lease_expired")
    for step in steps:
        step.setdefault("attempt", 1 + lost[step["seq"]])
    steps.sort(key=lambda s: (s["position"], s["seq"], s["epoch"] or 0))
    _timed(record, steps, details)
    return [Step(**step) for step in steps]


def _waits(record: RunRecord, details: list[tuple[LogEntry, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The run's "decision" steps: each pause of its own (a team's move to PAUSED for its member's
    pause is the member's), its decisions, and what ended the wait (the resume, or a cancel or an
    error while it was PAUSED)."""
    waits: list[dict[str, Any]] = []
    for entry, detail in details:
        open_ = waits[-1] if waits and waits[-1]["ended_at"] is None else None
        if entry.kind == "paused" and "requirements" in detail:
            asked = len(detail["requirements"] or ())
            where = int(detail.get("n_messages", 0))
            pause = dict(seq=entry.seq, task="decision", status="paused", attempt=1, epoch=None, position=where)
            waits.append(pause | dict(ended_at=None, asked=asked, decisions=[]))
        elif open_ is not None and entry.kind == "decision":
            by = detail.get("by")
            decided = StepDecision(
                requirement=str(detail.get("requirement")),
                by=str(by) if by is not None else None,
                decision=str(detail.get("decision", "")),
                at=entry.at,
            )
            open_["decisions"].append(decided)
        elif open_ is not None and entry.kind in ("resume", "cancel", "error") and detail.get("to") != "WAITING":
            open_.update(status="done", ended_at=entry.at)
    for wait in waits:
        wait["decisions"] = tuple(wait["decisions"])
    if waits and waits[-1]["ended_at"] is None and record.status != S.PAUSED:
        waits[-1].update(status="done", ended_at=record.updated_at)  # ended by a move not logged here
    return waits


def _fell_back(steps: list[dict[str, Any]], details: list[tuple[LogEntry, dict[str, Any]]]) -> None:
    """Give each model step the fallbacks logged in it: at its seq and position (a fallback keeps
    the step's seq; the reply is written under the epoch the fallback moved it to)."""
    for entry, detail in details:
        if entry.kind != "fallback":
            continue
        where = (entry.seq, int(detail.get("n_messages", 0)))
        step = next((s for s in steps if s["task"] == "model" and (s["seq"], s["position"]) == where), None)
        if step is not None:
            fallback = StepFallback(
                failed_model=str(detail.get("from", "")),
                model=str(detail.get("to", "")),
                error=_error(detail.get("error") or {}),
                at=entry.at,
            )
            step["fallbacks"] = (*step.get("fallbacks", ()), fallback)


def _where(detail: dict[str, Any]) -> dict[str, Any]:
    """The epoch and position a logged move left the run at."""
    return {"epoch": detail.get("epoch"), "position": int(detail.get("n_messages", 0))}


def _error(detail: dict[str, Any]) -> RunError:
    return RunError(type=str(detail.get("type", "Error")), message=str(detail.get("message", "")))


def _groups(rows: Sequence[Any], continued: set[tuple[Any, Any]]) -> list[list[Any]]:
    """The rows steps wrote, in runs of consecutive rows of one (seq, epoch): not the run's input
    (stamped 0, 0), a continue's new message, nor rows older than the stamps (NULL)."""
    groups: list[list[Any]] = []
    for row in rows:
        if row.seq is None or (row.seq, row.epoch) == (0, 0):
            continue
        if row.role == "user" and (row.seq, row.epoch) in continued:
            continue
        last = groups[-1][-1] if groups else None
        if last is not None and (last.seq, last.epoch) == (row.seq, row.epoch) and last.idx == row.idx - 1:
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def _written(group: list[Any], fanned: set[tuple[Any, Any]]) -> dict[str, Any]:
    first = group[0]
    task: Task = "tools"
    usage: list[Metrics | None] = []
    model = None
    for row in group:
        if row.role == "assistant":
            task = "model"
            usage.append(metrics_of(row))
            model = getattr(row, "model", None)
    if task == "tools" and (first.seq, first.epoch) in fanned:
        task = "fan_in"
    metrics = None
    if any(u is not None for u in usage):
        metrics = usage[0] if len(usage) == 1 else Metrics.total(usage)
    return dict(
        seq=first.seq,
        task=task,
        status="done",
        epoch=first.epoch,
        position=first.idx,
        messages=len(group),
        ended_at=max(r.created_at for r in group),
        metrics=metrics,
        started_at=min((r.step_started_at for r in group if r.step_started_at is not None), default=None),
        tool_errors=sum(bool(r.tool_call_error) for r in group),
        model=model,
        definition_hash=next((d for r in group if (d := getattr(r, "definition_hash", None)) is not None), None),
    )


def _failed(steps: list[dict[str, Any]], rows: Sequence[Any], seq: int, at: float, detail: dict[str, Any]) -> None:
    """Mark the step an error entry ended: the one that wrote rows under its seq and epoch (a tool
    batch that failed part way), or a new one that wrote nothing."""
    error, ran_on = _error(detail), detail.get("definition_hash")
    for step in steps:
        if (step["seq"], step["epoch"]) == (seq, detail.get("epoch")) and step["task"] != "fan_in":
            step.update(status="failed", error=error, ended_at=at)
            step["definition_hash"] = step.get("definition_hash") or ran_on
            return
    where = _where(detail)
    task: Task = "tools" if _owes(rows, where["position"]) else "model"
    steps.append(dict(seq=seq, task=task, status="failed", ended_at=at, error=error, definition_hash=ran_on, **where))


def _current(record: RunRecord, steps: list[dict[str, Any]]) -> None:
    """Add or mark the step in progress (RUNNING: with its worker) or waiting for one (QUEUED)."""
    if record.status not in (S.QUEUED, S.RUNNING) or record.next_step not in ("model", "tools"):
        return
    running = record.status == S.RUNNING
    worker, task_id = _owner(record.lease_owner) if running else (None, None)
    now = dict(
        status="running" if running else "queued",
        ended_at=None,
        worker=worker,
        task_id=task_id,
        attempt=max(record.attempts if running else record.attempts + 1, 1),
    )
    for step in steps:  # a tool batch in progress has written some results already
        if running and (step["seq"], step["epoch"]) == (record.seq, record.epoch):
            step.update(now)
            return
    task: Task = "tools" if record.next_step == "tools" else "model"
    steps.append(
        dict(seq=record.seq, task=task, epoch=record.epoch if running else None, position=record.n_messages, **now)
    )


def _timed(record: RunRecord, steps: list[dict[str, Any]], details: list[tuple[LogEntry, dict[str, Any]]]) -> None:
    """Set when each step could start and how long it took (see the module docstring)."""
    opened: dict[int, list[float]] = {}
    for entry, detail in details:
        if entry.kind in _OPENS or (entry.kind == "paused" and "requirements" in detail):
            delay = float(detail.get("delay", 0.0)) if entry.kind == "retry" else 0.0
            opened.setdefault(int(entry.seq or 0), []).append(entry.at + delay)
    before = record.created_at
    for step in steps:
        end = step.get("ended_at")
        ready = max([before, *(t for t in opened.get(step["seq"], ()) if end is None or t <= end)])
        start = step.get("started_at") or ready
        step.update(ready_at=ready, duration=None if end is None else max(end - start, 0.0))
        if end is not None:
            before = max(before, end)


def _owes(rows: Sequence[Any], position: int) -> bool:
    """Whether the first `position` messages owe tool results (the next step is a tool batch)."""
    owed: set[str] = set()
    for row in rows[:position]:
        if row.role == "assistant":
            owed = {str(c.get("id")) for c in (json.loads(row.tool_calls) if row.tool_calls else [])}
        elif row.role == "tool":
            owed.discard(row.tool_call_id)
    return bool(owed)


def _owner(owner: str | None) -> tuple[str | None, str | None]:
    """(host:pid, task id) of a lease owner written as host:pid:task id (a worker's); a lease
    owner of another shape is shown whole as the worker."""
    if owner is None:
        return None, None
    parts = owner.split(":", 2)
    return (f"{parts[0]}:{parts[1]}", parts[2]) if len(parts) == 3 else (owner, None)


__all__ = ["Step", "StepDecision", "StepFallback", "derive_steps"]
