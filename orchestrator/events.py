"""Run events: what a reader of a live run sees, with Agno's names, in one total order per run.

Durable events cost a step nothing: they are derived (`derive`) from rows the store writes
anyway: the run row, its messages (each stamped with the seq and epoch that wrote it), its member
runs and its `ratchet_events` rows. Live-only events (RunContent deltas and StepRestarted) exist
only for runs started with `stream=True` and travel through a `DeltaSink` (`orchestrator.ports`).

An event's id is four integers joined by "-" and ordered as a tuple. Its first is p, the run's
message count when the event happened, which only grows:

- an event derived from message idx i (ToolCallStarted per call of an assistant message,
  ToolCallCompleted, MemberRunCompleted for a delegation's result): (i + 1, 0, j, 0), j its index
  within the message;
- a status event (RunPaused, RunRequirementDecided, RunContinued, RunRetrying, RunCancelled,
  RunError, MemberRunStarted, FallbackModelActivated, RunCompleted) logged at count p while the
  run's epoch was E:
  (p, E + 1, 1, j), j its order among such events at (p, E); RunStarted is (0, 0, 0, 0);
- a live event of the step claimed at count p with epoch e: StepRestarted (p, e + 1, 0, 0) and
  its k-th delta (p, e + 1, 0, k).

Epochs only grow and every claim, continue, cancel and lease takeover bumps it, so within one p
the events of each attempt sort after those that came before it: an error or a retry logged
after a streamed attempt's deltas sorts after them, and a new attempt's deltas after the old's
(StepRestarted tells readers to drop the lower-epoch deltas of that step). A reader that resumes
`after` the last id it saw gets exactly the rest.

A person in the loop: RunPaused carries the requirements the pause asked (as asked: pending,
undecided, whatever was decided since), RunRequirementDecided one decision (the requirement as
decided: `decision`, `decided_by`, `decided_at`), and the decision that resumes the run is
followed by RunContinued (status QUEUED; WAITING for a team above a member that resumed). A
decision is logged while its run is PAUSED, at the pause's count and epoch: it sorts after the
pause, in the order the decisions came, and before the resume (whose move bumps the epoch), so
a reader that stopped at RunPaused and comes back `after` its id gets the decisions, then the
rest of the run. Agno has RunPaused and RunContinued; it has no event for one decision.

A fallback (`orchestrator.steps.fallbacks`): FallbackModelActivated, Agno's name, says which
model failed (`failed_model`, with its `error`) and which the step goes on with (`model`). It is
logged at the epoch of the call that failed, and the move bumps the epoch: it sorts after that
call's deltas and before the next call's StepRestarted and deltas.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.errors import InvalidInputError
from orchestrator.messages import Message
from orchestrator.requirements import RunRequirement
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus

EventName = Literal[
    "RunStarted",
    "RunContent",
    "ToolCallStarted",
    "ToolCallCompleted",
    "MemberRunStarted",
    "MemberRunCompleted",
    "RunError",
    "RunCompleted",
    "RunCancelled",
    "RunContinued",
    "RunRetrying",
    "RunPaused",
    "RunRequirementDecided",
    "FallbackModelActivated",
    "StepRestarted",
]
Key = tuple[int, int, int, int]
START: Key = (0, 0, 0, 0)
#: The largest part of an id: its first is a message index + 1, its second an epoch + 1, both
#: INTEGER columns (at most 2^31 - 1). A larger part names no event, and reading after it would
#: overflow the column it is compared with (a DataError on PostgreSQL).
MAX_PART = 2**31
#: What each `ratchet_events` kind becomes (kinds not named here are bookkeeping: fan-in, fence, sweep).
_LOGGED: dict[str, EventName] = {
    "continue": "RunContinued",
    "retry": "RunRetrying",
    "cancel": "RunCancelled",
    "error": "RunError",
    "delegate": "MemberRunStarted",
    "paused": "RunPaused",
    "decision": "RunRequirementDecided",
    "resume": "RunContinued",
    "fallback": "FallbackModelActivated",
}


class EventTool(BaseModel):
    """The tool call an event is about (Agno's `ToolExecution` fields)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tool_call_id: str
    tool_name: str
    tool_args: dict[str, Any] | None = None
    result: str | None = None
    tool_call_error: bool = False


class EventError(BaseModel):
    """Why a run failed or a model call is retried."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str
    message: str


class RunEvent(BaseModel):
    """One event of a run. `id` orders it within the run (see the module docstring); `seq` and
    `attempt` are the step and the epoch of the attempt that produced it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    event: EventName
    run_id: str
    seq: int | None = None
    attempt: int | None = None
    created_at: float
    #: A RunContent delta, or RunCompleted's (and MemberRunCompleted's) final content.
    content: str | None = None
    tool: EventTool | None = None
    member_run_id: str | None = None
    member_agent: str | None = None
    error: EventError | None = None
    #: The status the event moved the run (or the member run) to, where it moved one.
    status: str | None = None
    #: RunPaused's: what the pause asks of a person, one requirement per paused call (a team's
    #: name the member run each belongs to), as asked.
    requirements: list[RunRequirement] | None = None
    #: RunRequirementDecided's: the requirement as decided (who: `decided_by`, when:
    #: `decided_at`, what: `decision`).
    requirement: RunRequirement | None = None
    #: FallbackModelActivated's: the model the step goes on with (its id), and the one whose
    #: `error` made it fall back.
    model: str | None = None
    failed_model: str | None = None

    @property
    def key(self) -> Key:
        """The id as the tuple it is ordered by."""
        return parse_id(self.id)


def event_id(key: Key) -> str:
    """The id string of a key."""
    return "-".join(str(n) for n in key)


def parse_id(text: str) -> Key:
    """The key of an id string; InvalidInputError if it is not four non-negative integers, each
    at most MAX_PART."""
    parts = text.split("-")
    shown = repr(text if len(text) <= 64 else text[:60] + "...")  # a header can be kilobytes long
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts):
        raise InvalidInputError(f"event id {shown} is not four non-negative integers joined by '-' (e.g. 3-2-1-0)")
    key = tuple(int(p) if len(p) <= 10 else MAX_PART + 1 for p in parts)
    if max(key) > MAX_PART:
        raise InvalidInputError(
            f"event id {shown} has a part over {MAX_PART}, more than any event id holds: resume after an id "
            "an event of this run carried (or from the start, without one)"
        )
    return (key[0], key[1], key[2], key[3])


def message_key(idx: int, j: int) -> Key:
    """The key of the j-th event derived from message idx."""
    return (idx + 1, 0, j, 0)


def status_key(n_messages: int, epoch: int, j: int) -> Key:
    """The key of the j-th status event logged at this message count and epoch."""
    return (n_messages, epoch + 1, 1, j)


def live_key(n_messages: int, epoch: int, k: int) -> Key:
    """The key of a live event of the step claimed at this message count with this epoch:
    k = 0 is its StepRestarted, k >= 1 its deltas."""
    return (n_messages, epoch + 1, 0, k)


def drop_restarted(events: Iterable[RunEvent]) -> list[RunEvent]:
    """The events without the deltas of attempts that did not commit their reply: a delta is
    dropped when a later event that is not a delta has the same message count (a StepRestarted,
    or the error, retry or cancel that ended its attempt), since a reply that commits moves the
    count on. What a reader shows once a run has ended; a live reader drops them as it goes."""
    events = list(events)
    later: dict[int, Key] = {}  # p -> the highest key of an event at p that is not a delta
    for e in events:
        if e.event != "RunContent":
            later[e.key[0]] = max(later.get(e.key[0], START), e.key)
    return [e for e in events if e.event != "RunContent" or e.key > later.get(e.key[0], START)]


def since(after: Key | None) -> int:
    """The first message index whose events can come after `after` (rows below cannot yield a
    later key): where the rows `derive` needs start."""
    return max(after[0] - 1, 0) if after is not None else 0


def derive(
    record: RunRecord,
    messages: Sequence[Any],
    logged: Sequence[Any],
    members: Sequence[RunRecord] = (),
    *,
    after: Key | None = None,
    requirements: Sequence[RunRequirement] = (),
) -> list[RunEvent]:
    """The run's durable events after `after`, in id order, from its rows: `messages` (rows of
    `ratchet_messages` in idx order, any suffix of them), `logged` (rows of `ratchet_events` in id
    order), `members` (its member runs, for a team) and `requirements` (what it asked a person:
    its own, and for a team its members', tagged with the member run)."""
    out = [_event(record, START, "RunStarted", None, None, record.created_at, status=RunStatus.QUEUED.value)]
    for row in messages:
        if row.idx < record.n_messages:
            out += _from_message(record, row, members)
    out += _from_logged(record, logged, requirements)
    out.sort(key=lambda e: e.key)
    return out if after is None else [e for e in out if e.key > after]


def _event(
    record: RunRecord, key: Key, name: EventName, seq: int | None, attempt: int | None, at: float, **fields: Any
) -> RunEvent:
    return RunEvent(
        id=event_id(key), event=name, run_id=record.run_id, seq=seq, attempt=attempt, created_at=at, **fields
    )


def _from_message(record: RunRecord, row: Any, members: Sequence[RunRecord]) -> list[RunEvent]:
    """The events of one message row: its tool calls started, or its tool result."""
    if row.seq == 0 and row.epoch == 0:
        return []  # the run's input, written with it: history, not something that happens now
    message = Message.from_row(row)
    idx, seq, epoch, at = row.idx, row.seq, row.epoch, row.created_at
    if message.role == "assistant":
        return [
            _event(
                record,
                message_key(idx, j),
                "ToolCallStarted",
                seq,
                epoch,
                at,
                tool=EventTool(tool_call_id=c.id, tool_name=c.name, tool_args=c.arguments_dict()),
            )
            for j, c in enumerate(message.calls)
        ]
    if message.role != "tool":
        return []
    out = [
        _event(
            record,
            message_key(idx, j),
            "MemberRunCompleted",
            seq,
            epoch,
            at,
            member_run_id=m.run_id,
            member_agent=m.agent_name,
            content=m.content,
            status=m.status.value,
        )
        for j, m in enumerate(m for m in members if m.parent_tool_call_id == message.tool_call_id)
    ]
    tool = EventTool(
        tool_call_id=message.tool_call_id or "",
        tool_name=message.tool_name or "",
        tool_args=message.tool_args,
        result=message.content,
        tool_call_error=message.tool_call_error,
    )
    return [*out, _event(record, message_key(idx, len(out)), "ToolCallCompleted", seq, epoch, at, tool=tool)]


def _from_logged(record: RunRecord, logged: Sequence[Any], requirements: Sequence[RunRequirement]) -> list[RunEvent]:
    """The status events of the run's `ratchet_events` rows, then RunCompleted from its row."""
    out: list[RunEvent] = []
    taken: dict[tuple[int, int], int] = defaultdict(int)  # (p, epoch) -> status events so far
    paused_at: tuple[int, int] | None = None  # where the last pause was: its decisions go there

    def add(p: int, epoch: int, name: EventName, seq: int | None, at: float, **fields: Any) -> None:
        j = taken[(p, epoch)]
        taken[(p, epoch)] = j + 1
        out.append(_event(record, status_key(p, epoch, j), name, seq, epoch, at, **fields))

    for row in logged:
        name = _LOGGED.get(row.kind)
        detail = json.loads(row.detail) if row.detail else {}
        if name == "RunRequirementDecided" and "n_messages" not in detail and paused_at is not None:
            detail = {**detail, "n_messages": paused_at[0], "epoch": paused_at[1]}
        if name is None or "n_messages" not in detail:
            continue  # bookkeeping, or logged before events were derived (no position known)
        p, epoch, seq, at = int(detail["n_messages"]), int(detail.get("epoch", 0)), row.seq, row.at
        if name == "RunPaused":
            paused_at = (p, epoch)
        for fields in _fields(name, detail, at, requirements):
            add(p, epoch, name, seq, at, **fields)
    if record.status == RunStatus.COMPLETED:
        add(
            record.n_messages,
            record.epoch,
            "RunCompleted",
            record.seq,
            record.updated_at,
            content=record.content,
            status=record.status.value,
        )
    return out


def _fields(
    name: EventName, detail: dict[str, Any], at: float, requirements: Sequence[RunRequirement]
) -> list[dict[str, Any]]:
    """What the events of one logged row say, besides their place and time (a delegation is an
    event per member it started)."""
    if name == "MemberRunStarted":
        members = (detail.get("members") or {}).items()
        return [dict(member_run_id=m, member_agent=agent, status="QUEUED") for m, agent in members]
    if name in ("RunError", "RunRetrying"):
        error = (detail.get("error") if name == "RunRetrying" else detail) or {}
        status = "QUEUED" if name == "RunRetrying" else "ERROR"
        failed = EventError(type=str(error.get("type", "Error")), message=str(error.get("message", "")))
        return [dict(error=failed, status=status, member_run_id=detail.get("member_run_id"))]
    if name == "FallbackModelActivated":
        error = detail.get("error") or {}
        failed = EventError(type=str(error.get("type", "Error")), message=str(error.get("message", "")))
        return [dict(model=detail.get("to"), failed_model=detail.get("from"), error=failed, status="RUNNING")]
    if name == "RunPaused":
        return [dict(requirements=_asked(detail, at, requirements), status=RunStatus.PAUSED.value)]
    if name == "RunRequirementDecided":
        decided = next((r for r in requirements if r.id == detail.get("requirement")), None)
        return [dict(requirement=decided)]
    return [dict(status=detail.get("to"))]


def _asked(detail: dict[str, Any], at: float, requirements: Sequence[RunRequirement]) -> list[RunRequirement]:
    """What a pause asked, as asked (no decision): the requirements its row names, or for a team
    moved to PAUSED by a member's pause, its members' that were pending then."""
    if "requirements" in detail:
        named = {str(i) for i in detail["requirements"] or ()}
        found = [r for r in requirements if r.id in named]
    else:
        found = [
            r
            for r in requirements
            if r.member_run_id is not None and r.created_at <= at and (r.decided_at is None or r.decided_at > at)
        ]
    return [_as_asked(r) for r in found]


def _as_asked(requirement: RunRequirement) -> RunRequirement:
    """The requirement as its pause asked it: pending, undecided, its fields without values."""
    schema = requirement.user_input_schema
    return replace(
        requirement,
        status="pending",
        decision=None,
        decided_by=None,
        decided_at=None,
        user_input_schema=[{**f, "value": None} for f in schema] if schema is not None else None,
    )


__all__ = [
    "EventError",
    "EventName",
    "EventTool",
    "Key",
    "RunEvent",
    "derive",
    "drop_restarted",
    "event_id",
    "live_key",
    "message_key",
    "parse_id",
    "status_key",
]
