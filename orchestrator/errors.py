"""Every error Ratchet raises, in one hierarchy.

    RatchetError
    ├── ConfigurationError        settings or an agent definition are wrong
    │   └── InvalidInputError     a producer's argument cannot be taken (an id, a name, the input)
    │       └── UnresolvedHostError  a webhook's host did not resolve (at a delivery: tried again)
    ├── AgentNotFoundError        no agent or team is registered under that name
    ├── RunNotFoundError          no run has that run_id
    ├── RunConflictError          that run_id is taken by another request's run (or another user's)
    │   └── SessionOwnedError     that session belongs to another user: a run for this one is refused
    ├── ScheduleNotFoundError     no schedule has that id
    ├── ScheduleConflictError     that schedule id is taken
    ├── RunNotContinuableError    the run's status does not allow continue (CANCELLED)
    ├── RunBusyError              the run is going (RUNNING, its lease live) and cannot take this
    ├── RunLiveError              the run is live (going, or waiting on a human): not deleted
    ├── RunNotPausedError         a decision for a run that is not PAUSED (resumed, cancelled, ...)
    ├── RequirementNotFoundError  no requirement of that run has that id
    ├── DecisionConflictError     the requirement was decided already, another way (says who)
    ├── DecisionExpiredError      the requirement's deadline (or the run's) passed before the decision came
    ├── DecisionKindError         the decision does not fit what is asked (input for a confirmation)
    │   └── PausedToolChangedError  the paused call's tool changed since (gone, its flag, its arguments)
    ├── RunWaitTimeout            wait() gave up before the run reached a final status
    ├── QueueFullError            the agent (or the user) has its most runs QUEUED: a start is refused
    ├── BrokerUnavailableError    the run is saved as QUEUED but could not be published
    ├── FencedError               a step lost its lease; its commit was rolled back
    ├── ToolArgumentsError        a tool call's arguments do not fit the tool (the model reads why)
    ├── ModelCallError            one model call failed (retryable or final)
    ├── StepTimeoutError          a step ran past its soft time limit
    ├── ToolInterruptedError      an at-most-once tool started and never finished; not run again
    ├── ToolBatchLimitError       the model called tools past the agent's max_tool_batches
    ├── PoisonStepError           a step's worker died RATCHET_MAX_STEP_ATTEMPTS times
    ├── PauseTimeoutError         nobody decided a paused call before its deadline (on_timeout="error")
    ├── RunTimeoutError           the run passed its deadline (run_timeout=) before it finished
    ├── DefinitionChangedError    a deploy changed what the run's next step depends on (says what, and how to go on)
    └── MemberRunError            a member of a team ended in ERROR, so the team stopped

Each error's docstring says what happened and what to do. The errors above ModelCallError are
raised in the process that hit them. ModelCallError and those below it end a run in ERROR (a
retryable ModelCallError once the agent's retries are spent); they cross the process boundary as
data: the run's row keeps `to_record()`, a JSON-safe `(type, message)`, which a producer reads
back as `RunOutput.error` (a `RunError`). No exception is rebuilt from it. PausedToolChangedError
is both: a producer meets it at the door, and a worker ends a run in ERROR with it.
"""

from __future__ import annotations


class RatchetError(Exception):
    """Base of every Ratchet error."""

    def to_record(self) -> dict[str, str]:
        """A JSON-safe form: the error's type name and its text."""
        return {"type": type(self).__name__, "message": str(self)}


class ConfigurationError(RatchetError):
    """A setting or an agent definition is invalid. The message names it; fix it and restart."""


class InvalidInputError(ConfigurationError):
    """A producer passed something Ratchet cannot take: an id outside its format, a name or an
    input that cannot be stored (a NUL, a lone surrogate, too long), a value of the wrong type.

    Nothing was written. The message names the argument and the rule; fix the call and send it
    again. (A ConfigurationError, as the empty-input check was before this class existed.)"""


class UnresolvedHostError(InvalidInputError):
    """A webhook's host did not resolve: refused at a start, but at a delivery only tried again
    later (a DNS failure is often temporary; only an address the policy refuses is final)."""


class AgentNotFoundError(RatchetError):
    """No agent or team is registered under this name in this process.

    Import the module that defines it (workers: `ratchet worker --app your.module`)."""


class RunNotFoundError(RatchetError):
    """No run has this run_id in the configured database. Check the id and RATCHET_DATABASE_URL."""


class RunConflictError(RatchetError):
    """A run with this run_id already exists, started by another request.

    Starting twice with the same run_id and the same request (user, agent, input, stream,
    priority, session_state; the session, if given: `orchestrator.idempotency`) returns the
    existing run; anything else is a different run and needs an id of its own. The message says
    what differs, and of another user's run nothing but that the id is taken."""


class SessionOwnedError(RunConflictError):
    """A run was started (or forked) in a session that belongs to another user. A session is its
    first run's user's (no `user_id` is a user too), and only runs for that user join it, so that
    a session id that leaks never lets anyone read its history or state, or write into them.

    Nothing was written. Start the run with a new session_id, or none (a new session is made).
    The message names the session, never its user."""


class ScheduleNotFoundError(RatchetError):
    """No schedule has this id in the configured database (`ratchet schedule list` shows them)."""


class ScheduleConflictError(RatchetError):
    """A schedule with this id exists already: delete it first, or give another id."""


class RunNotContinuableError(RatchetError):
    """The run's status does not allow continue (a CANCELLED run is final). Start a new run."""


class RunBusyError(RatchetError):
    """The run is going and cannot take this continue: it is RUNNING on a worker whose lease is
    still live, or the continue carries input for a run that is going already (QUEUED, WAITING,
    RUNNING, or resumed by another request while this continue was on its way). Nothing was added.

    Wait for it to stop and send the continue again (a RUNNING run: or continue it after its
    lease expires, RATCHET_LEASE_SECONDS)."""


class RunLiveError(RatchetError):
    """A run asked to be deleted is live: QUEUED, RUNNING, WAITING or PAUSED (it is going, or a
    human's decision is pending), or it belongs to a team that is. Nothing live is deleted.

    Cancel it (`ratchet cancel RUN_ID`, which cancels its team's members too) or let it stop,
    then delete again. The run is in `run_id`."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunNotPausedError(RatchetError):
    """A decision came for a run that is not PAUSED: it was resumed (every requirement decided),
    cancelled, or its deadline acted. Nothing was stored. `ratchet show RUN_ID` says where it is."""


class RequirementNotFoundError(RatchetError):
    """No requirement of this run (or of its member runs) has this id. List the run's
    requirements (`RunOutput.requirements`, `ratchet pending`, `GET /runs/{id}`) and use one of
    their ids."""


class DecisionConflictError(RatchetError):
    """The requirement was decided already, another way; the first decision stands. The message
    says who decided it and when. The same decision sent again is not an error (it is idempotent)."""

    def __init__(self, message: str, *, decided_by: str | None, decided_at: float | None) -> None:
        super().__init__(message)
        self.decided_by = decided_by
        self.decided_at = decided_at


class DecisionExpiredError(RatchetError):
    """The requirement's deadline (`pause_timeout`) passed before this decision came, and its
    `on_timeout` policy decides instead (or has decided); or the run's own deadline
    (`run_timeout`, or its team's) passed, and the run stops in ERROR. Nothing was stored."""


class DecisionKindError(RatchetError, ValueError):
    """The decision does not fit what the requirement asks: an input for a confirmation, a
    confirmation of an external call, fields the tool does not ask of a person, a result that is
    not text. The message says what the requirement takes. (A ValueError too, as Agno's
    `RunRequirement` raises.)"""


class PausedToolChangedError(DecisionKindError):
    """A decision that would run a paused call, or answer it as its tool (a confirm, an input, an
    external result), came for a tool that is no longer the one the run paused on: a deploy
    removed it, renamed it, took away its flag (or changed what it asks), or changed the
    arguments it takes. The decision is not applied to another tool. The message says what changed.

    Refused at the door (a producer reads the agent's newest live definition in the catalog):
    nothing is stored. Reject the call instead (nothing runs; the model reads the rejection),
    cancel the run, or deploy code that serves the tool as it was and decide again.
    Found by the worker that resumes the run (the catalog did not tell): the run is in ERROR, the
    decision kept; deploy code that serves the tool as it was and continue the run, or cancel it.
    (A DecisionKindError, but a state of the deployment, not a mistake of the decider: the HTTP
    API answers 409 and `ratchet` exits 1.)"""


class RunWaitTimeout(RatchetError):
    """The run did not reach a final status in time. It goes on; wait again or inspect it."""


class QueueFullError(RatchetError):
    """A start was refused, nothing written: the agent already has its most runs QUEUED
    (`Agent(max_queued=)`, else RATCHET_MAX_QUEUED_PER_AGENT), or the run's user has
    (RATCHET_MAX_QUEUED_PER_USER). QUEUED runs wait for a worker to take their next step; the
    workers are behind. Send the start again later (the HTTP API answers 429 with Retry-After),
    add workers, or raise the limit.

    `scope` is "agent" or "user", `limit` the bound, `queued` how many were QUEUED when it was
    counted."""

    def __init__(self, message: str, *, scope: str, limit: int, queued: int) -> None:
        super().__init__(message)
        self.scope = scope
        self.limit = limit
        self.queued = queued


class BrokerUnavailableError(RatchetError):
    """The run was saved as QUEUED, but its first task could not be published.

    Nothing is lost: the workers' sweeper (or `ratchet sweep`) publishes it once the broker is
    back. The run_id is in `run_id`."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class FencedError(RatchetError):
    """A step's lease was taken over (it expired, or the run was cancelled); its commit was
    rolled back. Nothing to do: the holder of the newer lease carries the run on."""


class ToolArgumentsError(RatchetError):
    """The model sent a tool call whose arguments do not fit the tool's signature (not JSON, not
    an object, or failing validation). The message says which argument and why.

    Nothing to do in a run: the message goes back to the model as the call's error result, and
    the model can correct its call. Raised to you only by `Tool.parse_arguments`."""


class ModelCallError(RatchetError):
    """One model call failed.

    `retryable` says whether trying again may help (429, 5xx, timeouts, connection errors);
    final errors (401/403/400/404/422, context length) put the run in ERROR at once. Fix the
    cause (the API key on the workers, the request) and continue the run.

    `context_overflow` is set by the adapter that read the provider's own words for "the
    conversation no longer fits the model" (each provider says it differently): a fallback tries
    `on_context_overflow` for it."""

    def __init__(
        self,
        message: str = "",
        *,
        retryable: bool = False,
        status_code: int | None = None,
        retry_after: float | None = None,
        kind: str = "ModelCallError",
        context_overflow: bool = False,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status_code = status_code
        self.retry_after = retry_after
        self.kind = kind
        self.context_overflow = context_overflow

    def to_record(self) -> dict[str, str]:
        """Keeps the provider's error class name (e.g. AuthenticationError) as the type."""
        return {"type": self.kind, "message": str(self)}


class StepTimeoutError(RatchetError):
    """A step ran past its soft time limit. The run is in ERROR with its messages kept;
    raise the limit (RATCHET_SOFT_TIME_LIMIT) or make the tool faster, then continue."""


class ToolInterruptedError(RatchetError):
    """An at-most-once tool started and never finished (its worker died). It was not run again,
    because it may already have taken effect. Check its effect, then continue the run: the model
    is told the call's outcome is unknown."""


class ToolBatchLimitError(RatchetError):
    """The model kept calling tools past the agent's `max_tool_batches` since the user last
    spoke. Its last calls are answered as not run, so the run owes nothing: continue it with a new
    user message (the count starts again at each one), or raise `max_tool_batches` on the agent,
    restart the workers and continue it."""


class PoisonStepError(RatchetError):
    """A step was claimed RATCHET_MAX_STEP_ATTEMPTS times and its worker died every time (killed,
    out of memory, past the hard time limit). Find the cause in the worker logs, fix it, continue."""


class PauseTimeoutError(RatchetError):
    """Nobody decided a paused tool call before its deadline, and its `on_timeout` is "error".
    The run is in ERROR with its messages kept; continuing it pauses the call again with a new
    deadline."""


class RunTimeoutError(RatchetError):
    """The run passed its deadline (`run_timeout=` seconds from its start, PAUSED time
    included) before it finished, so the sweeper stopped it: it is in ERROR with every message
    it committed, and a step that was in progress was fenced (nothing of it written after the
    deadline). A team's deadline stops its member runs with it.

    Read it (`ratchet show RUN_ID`), then continue it: it gets its run_timeout again, counted
    from the continue, or the one the continue gives (`continue_run(run_id, run_timeout=...)`,
    `ratchet continue RUN_ID --run-timeout 30m`)."""


class DefinitionChangedError(RatchetError):
    """No live worker serves the definition the run has been running on any more, and the
    definition the workers serve now changed what its next step depends on: a tool its pending
    calls name was removed, its arguments' schema or its human-in-the-loop or at-most-once flags
    changed, or the output schema changed (docs/deploys.md says what is safe to change).

    The run is in ERROR with its messages kept. The message says what changed and the hash of
    the definition served now: continue the run with `accept_definition=` that hash (`ratchet
    continue RUN_ID --accept-definition HASH`, `{"accept_definition": HASH}` over HTTP; for a
    member of a team, `{member name: HASH}` on its team), or bring back a worker of its own
    definition and continue it."""


class MemberRunError(RatchetError):
    """A member of the team ended in ERROR, so the team stopped. The team's error names the
    member run; `ratchet show` the team to see both transcripts. Fix the cause and continue the
    team: the failed member continues in place, then the leader; finished members are kept."""
