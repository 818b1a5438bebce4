"""What a run looks like from outside: `RunRecord` (the row), `RunOutput` (row + transcript),
`Session` (a session's runs). Frozen values, built from rows with `from_row()`.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from pydantic import BaseModel, computed_field

from orchestrator.messages import Message
from orchestrator.requirements import RunRequirement, ToolExecution
from orchestrator.status import RunStatus
from orchestrator.usage import Metrics

#: The output schema `RunOutput.content_as` is asked for.
Schema = TypeVar("Schema", bound=BaseModel)


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One `ratchet_runs` row."""

    run_id: str
    session_id: str
    agent_name: str
    kind: str
    parent_run_id: str | None
    forked_from: str | None
    status: RunStatus
    epoch: int
    seq: int
    next_step: str | None
    n_messages: int
    system_message: str | None
    lease_owner: str | None
    lease_expires_at: float | None
    attempts: int
    retries: int
    publish_after: float | None
    content: str | None
    error_type: str | None
    error_message: str | None
    created_at: float
    updated_at: float
    #: For a member run: the id of the team's delegation tool call that started it.
    parent_tool_call_id: str | None = None
    #: Started with stream=True: its steps publish live events (text deltas, step restarts).
    stream: bool = False
    #: Who the run is for, as its producer said.
    user_id: str | None = None
    #: The earlier runs of the session its context includes, as JSON (`orchestrator.history`).
    history: str | None = None
    #: The priority its producer gave it, 0-9, higher first (None: none given, the lowest, as 0).
    priority: int | None = None
    #: The trace its steps' spans join, as a W3C traceparent (`orchestrator.tracing`); None:
    #: derived from the run id.
    trace_context: str | None = None
    #: SHA-256 of the input and session_state its start asked for (`orchestrator.idempotency`);
    #: None for a run no start wrote (a fork, a member run) or one written before migration 0012.
    request_digest: str | None = None
    #: The hash of its agent's definition when it started (`orchestrator.catalog`), or of the one
    #: a worker took it over under across a deploy (`orchestrator.deploys`); None when its
    #: producer found none, or for a run written before migration 0013.
    definition_hash: str | None = None
    #: The place in its agent's fallback chain of the model its current model step calls
    #: (`orchestrator.models.fallback`); None: 0, the agent's own model.
    model_index: int | None = None
    #: When the step last claimed was queued (the claim's copy of `updated_at` before it; None
    #: on a claim of a RUNNING run whose lease expired, or before migration 0018).
    queued_at: float | None = None
    #: The URL told of each stop of the run (`orchestrator.webhooks`); None: none.
    webhook: str | None = None
    #: When the run's deadline passes (UNIX seconds; `orchestrator.deadlines`), and the seconds it
    #: was given; None: none (a team's member runs: their team's covers them).
    deadline_at: float | None = None
    run_timeout: float | None = None
    #: A run of its session waits behind this one (`serialize_session_runs`): its stop gives the
    #: first one waiting its turn (`orchestrator.store.turns`). None: none waits.
    wakes_session: bool | None = None
    #: A definition a continue accepted for the run although it changed what the run's next step
    #: depends on (`orchestrator.deploys`): a worker serving it takes the run over; None: none.
    accepted_definition: str | None = None

    @classmethod
    def from_row(cls, row: Any) -> RunRecord:
        """Build from a SQLAlchemy row with the columns of `ratchet_runs` (others are ignored).

        Every claim, commit and poll builds one, so the values go straight into the instance:
        a frozen dataclass's `__init__` sets each of its 23 fields through `object.__setattr__`,
        which was two-thirds of the cost (9.8 -> 2.9 us)."""
        values = row._mapping
        data = {name: values[name] for name in _REQUIRED}
        data.update((name, values.get(name, default)) for name, default in _OPTIONAL)
        data["status"] = RunStatus(data["status"])
        record = object.__new__(cls)
        record.__dict__.update(data)
        return record

    def lease_live(self, now: float) -> bool:
        """Whether a worker's lease on this run has not yet expired."""
        return self.lease_expires_at is not None and self.lease_expires_at > now


_REQUIRED = tuple(f.name for f in fields(RunRecord) if f.default is MISSING)
_OPTIONAL = tuple((f.name, f.default) for f in fields(RunRecord) if f.default is not MISSING)


@dataclass(frozen=True, kw_only=True)
class RunError:
    """Why a run is in ERROR: the error's type name and text."""

    type: str
    message: str

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"


@dataclass(frozen=True, kw_only=True)
class RetryWait:
    """Why a QUEUED run is waiting, and until when: a model call failed and is retried later."""

    #: Which retry of the current step this is (1 for the first).
    attempt: int
    #: When the retry is due (UNIX seconds); the provider's Retry-After is honoured.
    until: float
    #: The failure being retried, as "Type: message".
    reason: str

    def __str__(self) -> str:
        return f"retry {self.attempt} due at {self.until:.0f} after {self.reason}"


@dataclass(frozen=True, kw_only=True)
class RunOutput:
    """A run as a producer sees it: Agno's `RunOutput` fields plus Ratchet's bookkeeping."""

    run_id: str
    session_id: str
    agent_name: str
    status: RunStatus
    #: The final answer as stored: text, for an agent with an `output_schema` the JSON text,
    #: in every process (`content_as` parses it). `Agent.run()` and friends give an instance of
    #: the agent's schema instead, or the text if it no longer validates.
    content: Any
    messages: list[Message]
    error: RunError | None = None
    parent_run_id: str | None = None
    forked_from: str | None = None
    seq: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    #: Child runs (team members), oldest first.
    member_runs: list[RunOutput] = field(default_factory=list)
    #: For a QUEUED run whose model call failed and waits to be retried: why, and until when.
    retry: RetryWait | None = None
    #: With session history on: the earlier runs of the session its context included, oldest
    #: first, as fixed at its first step (None if it has no history, or before its first step).
    history_run_ids: list[str] | None = None
    #: Who the run is for, as its producer said (Agno's `RunOutput.user_id`).
    user_id: str | None = None
    #: The session's state as read with the run: once the run has ended, its state after the run
    #: unless a later run of the session changed it since (`orchestrator.state`); {} for a run in
    #: another user's session, which only a store written before sessions took one user holds.
    session_state: dict[str, Any] = field(default_factory=dict)
    #: The priority the run was started with, 0-9, higher first (None: none given, the lowest).
    priority: int | None = None
    #: The hash of its agent's definition: the one it started with, or the one a worker took it
    #: over under across a deploy (`orchestrator.deploys`; None: unknown). Each step's own is
    #: `Step.definition_hash` (`Client.get_steps`).
    definition_hash: str | None = None
    #: What the run asked of a person, in order of arrival (Agno's `RunOutput.requirements`),
    #: decided ones included; a team's include its members' (naming the member).
    requirements: list[RunRequirement] = field(default_factory=list)
    #: When the run's deadline passes (UNIX seconds): past it, a run still going is stopped in
    #: ERROR with RunTimeoutError. `run_timeout`: the seconds it was given. None: no deadline.
    deadline_at: float | None = None
    run_timeout: float | None = None

    @computed_field  # type: ignore[prop-decorator]  # so the HTTP API's run carries it
    @property
    def is_paused(self) -> bool:
        """The run waits for a person (or a raised budget): Agno's `RunOutput.is_paused`."""
        return self.status == RunStatus.PAUSED

    @computed_field  # type: ignore[prop-decorator]  # so the HTTP API's run carries it
    @property
    def active_requirements(self) -> list[RunRequirement]:
        """The requirements still waiting for a decision (Agno's `active_requirements`)."""
        return [r for r in self.requirements if r.is_active]

    @property
    def tools(self) -> list[ToolExecution]:
        """The tool calls that ran, with their results (Agno's `RunOutput.tools`), in order."""
        return [
            ToolExecution(
                tool_call_id=m.tool_call_id or "",
                tool_name=m.tool_name or "",
                tool_args=m.tool_args,
                result=m.content,
                tool_call_error=m.tool_call_error,
            )
            for m in self.messages
            if m.role == "tool"
        ]

    def content_as(self, schema: type[Schema]) -> Schema | None:
        """The final answer as an instance of `schema` (an agent's `output_schema`), for a
        producer that holds the schema but not the agent: None if the run has none, pydantic's
        ValidationError if the stored JSON does not follow it."""
        if self.content is None or isinstance(self.content, schema):
            return self.content
        text = self.content.model_dump_json() if isinstance(self.content, BaseModel) else self.content
        return schema.model_validate_json(text)

    @computed_field  # type: ignore[prop-decorator]  # so the HTTP API's run carries it
    @property
    def metrics(self) -> Metrics:
        """The tokens and cost of this run's model calls and of its member runs' (Agno's
        `RunOutput.metrics`); a count is None if any call's is unknown (`orchestrator.usage`)."""
        own = (m.metrics for m in self.messages if m.role == "assistant")
        return Metrics.total([*own, *(member.metrics for member in self.member_runs)])

    @classmethod
    def from_record(
        cls,
        record: RunRecord,
        messages: list[Message],
        member_runs: list[RunOutput] | None = None,
        retry: RetryWait | None = None,
        session_state: dict[str, Any] | None = None,
        requirements: list[RunRequirement] | None = None,
    ) -> RunOutput:
        """The output of a run: its row, with the system message first, then the stored rows."""
        transcript = list(messages)
        if record.system_message is not None:
            transcript.insert(0, Message(role="system", content=record.system_message))
        error = (
            RunError(type=record.error_type or "Error", message=record.error_message or "")
            if record.error_type or record.error_message
            else None
        )
        return cls(
            run_id=record.run_id,
            session_id=record.session_id,
            agent_name=record.agent_name,
            status=record.status,
            content=record.content,
            messages=transcript,
            error=error,
            parent_run_id=record.parent_run_id,
            forked_from=record.forked_from,
            seq=record.seq,
            created_at=record.created_at,
            updated_at=record.updated_at,
            member_runs=member_runs or [],
            retry=retry,
            history_run_ids=[str(run_id) for run_id, _ in json.loads(record.history)] if record.history else None,
            user_id=record.user_id,
            session_state=session_state if session_state is not None else {},
            priority=record.priority,
            definition_hash=record.definition_hash,
            requirements=requirements or [],
            deadline_at=record.deadline_at,
            run_timeout=record.run_timeout,
        )


@dataclass(frozen=True, kw_only=True)
class Session:
    """A session and its top-level runs, oldest first (member runs hang under their team run)."""

    session_id: str
    runs: list[RunOutput]
    #: Who the session belongs to: the user of its first run.
    user_id: str | None = None
    #: The session's state ({} until one is set): what its tools read and changed (`orchestrator.state`).
    session_state: dict[str, Any] = field(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]  # so the HTTP API's session carries it
    @property
    def metrics(self) -> Metrics:
        """The tokens and cost of every run of the session, member runs included."""
        return Metrics.total(run.metrics for run in self.runs)


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """A run as a listing shows it: its row without the transcript, the prompt or the answer."""

    run_id: str
    session_id: str
    agent_name: str
    #: "agent" or "team".
    kind: str
    status: RunStatus
    #: For a member run: its team's run.
    parent_run_id: str | None = None
    forked_from: str | None = None
    user_id: str | None = None
    #: Why the run is in ERROR (or why it stopped), if it did.
    error: RunError | None = None
    #: The step counter: how many steps the run has taken.
    seq: int = 0
    #: Retries of the current step after transient model failures.
    retries: int = 0
    #: Messages stored (the system message not counted).
    n_messages: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0

    @classmethod
    def from_row(cls, row: Any) -> RunSummary:
        """Build from a row with the columns of `ratchet_runs` that a summary shows."""
        v = row._mapping
        error = (
            RunError(type=v["error_type"] or "Error", message=v["error_message"] or "")
            if v["error_type"] or v["error_message"]
            else None
        )
        return cls(
            run_id=v["run_id"],
            session_id=v["session_id"],
            agent_name=v["agent_name"],
            kind=v["kind"],
            status=RunStatus(v["status"]),
            parent_run_id=v["parent_run_id"],
            forked_from=v["forked_from"],
            user_id=v["user_id"],
            error=error,
            seq=v["seq"],
            retries=v["retries"],
            n_messages=v["n_messages"],
            created_at=v["created_at"],
            updated_at=v["updated_at"],
        )


@dataclass(frozen=True, kw_only=True)
class RunPage:
    """One page of a listing of runs, newest first, and where the next page starts."""

    runs: list[RunSummary]
    #: Pass it as `cursor` to get the next page; None on the last page.
    next_cursor: str | None = None


@dataclass(frozen=True, kw_only=True)
class LogEntry:
    """Something that happened to a run besides its messages, as the store logged it with the
    move (`ratchet_events`): a retry, an error, a lease taken back by the sweeper, a fenced
    write, a delegation or fan-in, a continue, a cancel, a pause, a person's decision, a resume,
    the final answer committed."""

    #: The entry's id: entries of a run are in id order.
    id: int
    run_id: str
    #: When (UNIX seconds).
    at: float
    #: What: "retry", "throttled", "error", "lease_expired", "fenced", "delegate", "fan_in", "continue",
    #: "cancel", "paused" (detail: the `requirements` it asked, by id; a team's: `to` PAUSED, for its
    #: member's pause), "decision" (`requirement`, `by`, `decision` in a few words), "resume" (the
    #: last decision queued the run again: `to` QUEUED; a team above it: `to` WAITING), "fallback"
    #: (a model step's model failed for good and the step went on with a fallback model: `from`,
    #: `to`, their `index` in the chain, the `error`), "session_wait" (a serialized session's run
    #: parked at its first step: `behind`, the runs ahead of it, up to 10, and `ahead`, how many),
    #: "session_turn" (its turn came: it is due again), "completed" (the move to COMPLETED, no
    #: detail: since migration 0018), "definition" (across a deploy, the run went on under the
    #: definition of the worker that claimed it: `from`, `to`, `why`), "handed_on" (that worker
    #: handed the step on to a live worker of the run's definition, `to`: `orchestrator.deploys`).
    #: A "fenced" entry whose run was cancelled while the step ran says `cause` "cancel"; an
    #: "error" entry of a step says the `definition_hash` of its worker.
    kind: str
    #: The step it happened at.
    seq: int | None
    #: The particulars, as logged (an error's type and message, a retry's delay, the status moved to...).
    detail: dict[str, Any] | None = None
