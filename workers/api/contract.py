"""The API's contract: the bodies it takes and gives, and the limits of each value in its schema.

A request is checked where every producer's is, in `orchestrator.validation` (a run id, a name,
an input) and the store (a cursor, a time): the API answers the same InvalidInputError as
`Client` and the command line, with the same message. What those checks accept is stated here
in the OpenAPI schema (lengths, patterns, ranges), so that a client generated from the schema,
or a fuzzer, sends what the server takes: `tests/unit/test_api_contract.py` holds each rule to
its validator, both ways where the rule is exact.

The patterns are written for every engine that reads them: pydantic's, Python's `re` (which
schema-driven tools generate from) and JSON Schema's ECMA-262, so they use `\\uXXXX` escapes and
character classes, no lookarounds and no Unicode properties.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

from orchestrator import validation as v
from orchestrator.batches import BATCH_MAX
from orchestrator.requirements import DECISION_TEXT_MAX, Decision
from orchestrator.status import RunStatus

#: The characters `str.isspace()` (and so `str.strip()`) takes for whitespace.
SPACE = r"\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
#: A name or an id: no control character (Unicode's Cc: U+0000-U+001F, U+007F-U+009F).
NO_CONTROL = r"^[^\u0000-\u001f\u007f-\u009f]+$"
#: A header value as sent: HTTP drops spaces and tabs around it, so it starts and ends with neither.
HEADER_NAME = r"^[^\u0000-\u0020\u007f-\u009f]([^\u0000-\u001f\u007f-\u009f]*[^\u0000-\u0020\u007f-\u009f])?$"
#: A user message: something besides whitespace, and no NUL.
INPUT = rf"^[^\u0000]*[^\u0000{SPACE}][^\u0000]*$"


def _any_case(word: str) -> str:
    return "".join(f"[{c}{c.lower()}]" for c in word)


_STATUS = f"[{SPACE}]*({'|'.join(_any_case(s.value) for s in RunStatus)})[{SPACE}]*"
#: Run statuses in any case, several separated by commas (`validation.statuses`).
STATUSES = rf"^{_STATUS}(,{_STATUS})*$"
#: The forms of a time the listing reads (`validation.moment`), stated strictly: UNIX seconds,
#: how long ago ("6h", "7d"), or an ISO 8601 date, or date and time, with an optional offset.
MOMENT = (
    r"^(-?[0-9]{1,12}(\.[0-9]{1,6})?|[0-9]{1,6}(\.[0-9]{1,3})?[smhdwSMHDW]|[1-9][0-9]{3}-"
    r"((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))"
    r"([T ]([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?)?)$"
)
#: A run event's id: four integers joined by "-" (`orchestrator.events`), stated within its
#: limit of 2^31 each as nine digits.
EVENT_ID = r"^[0-9]{1,9}-[0-9]{1,9}-[0-9]{1,9}-[0-9]{1,9}$"
#: The Last-Event-ID header: an event id, or empty for none (an EventSource that saw no id).
LAST_EVENT_ID = {"minLength": 0, "pattern": r"^([0-9]{1,9}-[0-9]{1,9}-[0-9]{1,9}-[0-9]{1,9})?$"}
#: A listing's cursor as it hands them out: URL-safe base64 without padding (`store.listing`).
CURSOR = r"^[A-Za-z0-9_-]{1,1024}$"
_CHECK = f"[{SPACE}]*(database|broker|workers|sweeper|beat)[{SPACE}]*"
#: `GET /health/checks?check=`: check names, several separated by commas (`workers.health`).
CHECKS = rf"^{_CHECK}(,{_CHECK})*$"


#: A definition hash, as the agent catalog and a DefinitionChangedError show it.
DEFINITION_HASH = r"^[0-9a-f]{64}$"


def name(limit: int) -> dict[str, Any]:
    """The schema of a name or an id of at most `limit` characters."""
    return {"minLength": 1, "maxLength": limit, "pattern": NO_CONTROL}


#: The schema of a definition hash (as text: the rule alone applies to a text of a union).
DEFINITION_RULE: dict[str, Any] = {"minLength": 64, "maxLength": 64, "pattern": DEFINITION_HASH}
DEFINITION: dict[str, Any] = {"type": "string", **DEFINITION_RULE}


def pattern(regex: str) -> dict[str, Any]:
    """The schema of text matching `regex`."""
    return {"minLength": 1, "pattern": regex}


def text(rule: dict[str, Any]) -> WithJsonSchema:
    """The schema of a parameter that is text fitting `rule` (a parameter left out takes its
    default: it is never null, as FastAPI would state an optional one)."""
    return WithJsonSchema({"type": "string", **rule})


def texts(rule: dict[str, Any]) -> WithJsonSchema:
    """The schema of a parameter given any number of times, each value text fitting `rule`."""
    return WithJsonSchema({"type": "array", "items": {"type": "string", **rule}})


#: The user message, and its size: at most 1 MiB of UTF-8, so at most that many characters.
INPUT_TEXT: dict[str, Any] = {"minLength": 1, "maxLength": v.INPUT_MAX_BYTES, "pattern": INPUT}

#: A run id in a path: any run's (`validation.known_run_id`), not only those new runs may take.
RunId = Annotated[str, Path(description="a run's id"), text(name(v.RUN_ID_MAX))]
#: A requirement's id in a path (`validation.requirement_id`).
RequirementId = Annotated[str, Path(description="a requirement's id, as the run lists it"), text(name(v.RUN_ID_MAX))]
SessionId = Annotated[str, Path(description="a session's id"), text(name(v.SESSION_ID_MAX))]


def _whole(value: object) -> object:
    """A JSON number that is a whole number as the int it is (JSON Schema's integer takes 2.0)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


#: What `run_timeout` is, in a start's and a continue's body.
DEADLINE_TEXT = (
    "seconds from now to the run's deadline, PAUSED time included (a start: default its agent's run_timeout): past "
    "it, the run still going is stopped in ERROR with RunTimeoutError, its team's member runs with it"
)


class StartRequest(BaseModel):
    """The body of `POST /runs`."""

    model_config = ConfigDict(extra="forbid")

    agent: str = Field(
        description="the name of an agent or team defined in the server's --app modules",
        json_schema_extra=name(v.AGENT_NAME_MAX),
    )
    input: str = Field(
        description="the user's message: not only whitespace, no NUL, at most 1 MiB of UTF-8",
        json_schema_extra=INPUT_TEXT,
    )
    session_id: str | None = Field(
        default=None,
        description="the session to run in (default: a new one); a session is its first run's user_id's, and a run "
        "for another user_id in it is refused (409 SessionOwnedError, nothing written)",
        json_schema_extra=name(v.SESSION_ID_MAX),
    )
    stream: bool = Field(
        default=False,
        strict=True,
        description="publish the model's text as it is written (RunContent events), not only each step",
    )
    user_id: str | None = Field(
        default=None,
        description="who the run is for; with RATCHET_MAX_RUNS_PER_KEY set, at most that many runs of one user_id "
        "(or of the key the agent's concurrency_key makes of it) are in progress at once",
        json_schema_extra=name(v.USER_ID_MAX),
    )
    session_state: dict[str, Any] | None = Field(
        default=None,
        description="merged over the session's stored state, key by key, as the run is written (a JSON object, "
        "at most 1 MiB as JSON); the run's tools read and change the result",
    )
    priority: Annotated[int | None, BeforeValidator(_whole)] = Field(
        default=None,
        ge=v.PRIORITY_MIN,
        le=v.PRIORITY_MAX,
        strict=True,
        description="0-9, higher first: under a backlog its steps go before lower ones' (default: none, as 0)",
    )
    webhook: str | None = Field(
        default=None,
        json_schema_extra={"minLength": 1, "maxLength": 2048, "pattern": r"^https?://\S+$"},
        description="an http(s) URL POSTed a signed summary each time the run stops (COMPLETED, ERROR, CANCELLED, "
        "PAUSED); its host must resolve to public addresses unless RATCHET_WEBHOOK_ALLOW lists it",
    )
    run_timeout: float | None = Field(
        default=None,
        gt=0,
        le=v.RUN_TIMEOUT_MAX,
        strict=True,
        allow_inf_nan=False,
        description=DEADLINE_TEXT,
    )


#: What a decision is: its kind, by name (`orchestrator.requirements.Decision`).
DECISION_KIND = r"^(confirm|reject|input|result|budget)$"
#: A decision's note or an external call's result: any text up to what a decision takes (the
#: model reads it as the call's result).
DECISION_TEXT: dict[str, Any] = {"minLength": 0, "maxLength": DECISION_TEXT_MAX, "pattern": r"^[\s\S]*$"}
#: Who decides, as stored with the decision (`validation.decider`).
DECIDER: dict[str, Any] = name(v.USER_ID_MAX)


class DecisionBody(BaseModel):
    """A person's answer to one requirement (`orchestrator.requirements.Decision`): "confirm" or
    "reject" (with a `note` the model reads) a confirmation; "input" (`values`: the fields the
    tool asks of a person) or "reject" a user_input; "result" (what the caller's own run of it
    returned) or "reject" an external_execution; "budget" (`values`: a higher `max_tokens` and/or
    `max_cost`) a budget."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["confirm", "reject", "input", "result", "budget"] = Field(
        description="confirm, reject, input, result or budget: what the requirement asks says which it takes",
        json_schema_extra=pattern(DECISION_KIND),
    )
    note: str | None = Field(
        default=None,
        description="a rejection's reason: the model reads it as the call's result",
        json_schema_extra=DECISION_TEXT,
    )
    values: dict[str, Any] | None = Field(
        default=None,
        description="input: each field the tool asks of a person, by name; budget: max_tokens and/or max_cost",
    )
    result: str | None = Field(
        default=None,
        description="result: what the external call returned, which the model reads",
        json_schema_extra=DECISION_TEXT,
    )

    def decision(self) -> Decision:
        """The decision, as `Decision.from_json` takes it (DecisionKindError if it is not one)."""
        return Decision.from_json(self.model_dump(include={"kind", "note", "values", "result"}, exclude_none=True))


class DecideRequest(DecisionBody):
    """The body of `POST /runs/{run_id}/requirements/{requirement_id}`: the decision, and who
    makes it."""

    by: str | None = Field(
        default=None,
        description="who decides: kept with the decision, and named to anyone whose later decision differs",
        json_schema_extra=DECIDER,
    )


class RequirementDecision(BaseModel):
    """One decision a continue carries: the requirement's id and the decision on it."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(description="the requirement's id, as the run lists it", json_schema_extra=name(v.RUN_ID_MAX))
    decision: DecisionBody


class ContinueRequest(BaseModel):
    """The body of `POST /runs/{run_id}/continue` (optional: continue without new input, or with
    decisions on a PAUSED run's requirements)."""

    model_config = ConfigDict(extra="forbid")

    input: str | None = Field(default=None, description="a new user message to add first", json_schema_extra=INPUT_TEXT)
    fork_key: str | None = Field(
        default=None,
        description="a COMPLETED run forks once per key (default: the input); another key forks again",
        json_schema_extra=name(v.FORK_KEY_MAX),
    )
    requirements: list[RequirementDecision] | None = Field(
        default=None,
        description="decisions on a PAUSED run's requirements, stored one by one first, in order; the last pending "
        "one queues the run again (without input, that is the continue)",
        max_length=v.PAGE_MAX,
    )
    by: str | None = Field(default=None, description="who makes these decisions", json_schema_extra=DECIDER)
    run_timeout: float | None = Field(
        default=None,
        gt=0,
        le=v.RUN_TIMEOUT_MAX,
        strict=True,
        allow_inf_nan=False,
        description=DEADLINE_TEXT + "; without it, a deadline that passed is given again from now",
    )
    accept_definition: str | dict[str, str] | None = Field(
        default=None,
        description="for a run in ERROR with DefinitionChangedError (a deploy changed what its next step depends on): "
        "the hash of the definition it may go on under anyway, as the error names it; for a team, agent names to "
        "hashes for its members",
        json_schema_extra={
            **DEFINITION_RULE,
            "maxProperties": v.ACCEPTED_MAX,
            "anyOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": DEFINITION,
                    "propertyNames": name(v.AGENT_NAME_MAX),
                },
                {"type": "null"},
            ],
        },
    )


def _ids_or_filter(schema: dict[str, Any]) -> None:
    """What the batch routes check, said in their body's schema: run ids and nothing else, or a
    filter with a status (the others null or left out)."""
    fields = list(schema.get("properties", {}))
    null = {"type": "null"}
    by_ids = {name: null for name in fields if name != "run_ids"} | {"run_ids": {"type": "array"}}
    by_filter = {"run_ids": null, "status": {"type": "array"}}
    schema["oneOf"] = [
        {"required": ["run_ids"], "properties": by_ids},
        {"required": ["status"], "properties": by_filter},
    ]


class BatchRequest(BaseModel):
    """The body of `POST /batches/continue` and `POST /batches/cancel`: the runs, by id or by a filter
    with a status (`orchestrator.batches`), never both, never every run."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=lambda schema: _ids_or_filter(schema))

    run_ids: list[Annotated[str, Field(json_schema_extra=name(v.RUN_ID_MAX))]] | None = Field(
        default=None, min_length=1, max_length=BATCH_MAX, description=f"the runs, by id (at most {BATCH_MAX})"
    )
    status: list[Annotated[str, Field(json_schema_extra=pattern(STATUSES))]] | None = Field(
        default=None, min_length=1, description="without run_ids: runs in these statuses (ERROR, say); needed"
    )
    agent: str | None = Field(
        default=None, description="runs of this agent or team", json_schema_extra=name(v.AGENT_NAME_MAX)
    )
    session_id: str | None = Field(
        default=None, description="runs in this session", json_schema_extra=name(v.SESSION_ID_MAX)
    )
    user_id: str | None = Field(
        default=None, description="runs for this user (a user's token: its own)", json_schema_extra=name(v.USER_ID_MAX)
    )
    since: str | None = Field(
        default=None, description="created at or after (as GET /runs)", json_schema_extra=pattern(MOMENT)
    )
    until: str | None = Field(
        default=None, description="created before (as GET /runs)", json_schema_extra=pattern(MOMENT)
    )
    limit: int | None = Field(
        default=None,
        ge=1,
        le=BATCH_MAX,
        strict=True,
        description=f"runs the filter's batch takes (default {BATCH_MAX})",
    )
    cursor: str | None = Field(
        default=None, description="the next_cursor of the previous batch", json_schema_extra=pattern(CURSOR)
    )


class ErrorDetail(BaseModel):
    """What went wrong: the error's type name, for a client to branch on, and what to do."""

    type: str = Field(description="the error's name: RunNotFoundError, RequestValidationError, Unauthorized...")
    message: str = Field(description="what went wrong and what to do (the same text as `detail`)")
    run_id: str | None = Field(
        default=None,
        description="503: the run, saved as QUEUED, that the sweeper will publish; 409 RunLiveError: the live run",
    )
    details: list[dict[str, Any]] | None = Field(
        default=None, description="422 only: each field that does not fit (`loc`, `msg`, `type`)"
    )
    decided_by: str | None = Field(
        default=None, description="409 DecisionConflictError: who made the decision that stands (null: unnamed)"
    )
    decided_at: float | None = Field(default=None, description="409 DecisionConflictError: when (UNIX seconds)")


class ErrorBody(BaseModel):
    """Every error response, of every route and status (`workers.api.problems`): `detail` says
    what went wrong and what to do, `error.type` names the error."""

    detail: str = Field(
        description="what went wrong and what to do: always text, a 422's too (its fields are in `error.details`)"
    )
    error: ErrorDetail


class Health(BaseModel):
    """The answer of `GET /health`."""

    status: Literal["ok"] = "ok"


#: The operations a run's answer links to, by operationId (each route states its own, in camelCase).
_BY_RUN = ("getRun", "waitForRun", "continueRun", "cancelRun", "streamRunEvents", "getRunLog", "getRunSteps")
_BY_SESSION = ("getSession", "deleteSession")
#: OpenAPI links of an answer that is a run: what a client can do with it next, by its run_id and
#: session_id (a generated client, and a stateful fuzzer, follow them).
RUN_LINKS: dict[str, Any] = {
    operation[0].upper() + operation[1:]: {"operationId": operation, "parameters": {key: f"$response.body#/{key}"}}
    for key, operations in (("run_id", _BY_RUN), ("session_id", _BY_SESSION))
    for operation in operations
}
#: What every operation may answer besides its own refusals: a fault of the server's.
SERVER_FAULT = 500


def refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The `responses=` of a route answering JSON: these statuses and a 500, each with the error body."""
    return {code: {"model": ErrorBody} for code in (*codes, SERVER_FAULT)}


def json_refusals(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The same for a route whose own answer is not JSON (a stream, plain text): its errors are."""
    return {code: error_content() for code in (*codes, SERVER_FAULT)}


def error_content() -> dict[str, Any]:
    """A response of the schema whose body is the error body, as JSON."""
    return {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
