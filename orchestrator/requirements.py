"""A person in the loop: what a paused run asks (`RunRequirement`) and what a person answers
(`Decision`), in Agno's names so that code written for Agno ports unchanged.

A tool flagged `requires_confirmation`, `requires_user_input` or `external_execution` is not run
when the model calls it: its batch commits the other calls' results, then the run moves to PAUSED
with one requirement per paused call. A person decides each one (`confirm()`, `reject(note=...)`,
`provide_user_input({...})`, `set_external_execution_result(...)`), and the decisions are stored
one by one as they arrive (`Client.decide`, or `continue_run(requirements=...)`); when the last
requirement of the batch is decided, the run is queued again under the same run_id and its tool
step acts on each decision. A budget spent (`pause_type="budget"`) pauses a run the same way.

A requirement is decided once: the same decision sent again is a no-op, another one is refused
and names who decided first (`DecisionConflictError`). A decision that does not fit what is asked
is a `DecisionKindError` (a `ValueError`, as Agno raises).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from orchestrator.errors import ConfigurationError, DecisionKindError

#: What a requirement asks of a person (Agno's `pause_type`), and Ratchet's budget pause.
PauseType = Literal["confirmation", "user_input", "external_execution", "budget"]
PAUSE_TYPES: tuple[PauseType, ...] = ("confirmation", "user_input", "external_execution", "budget")


def pause_type_of(
    *, external_execution: bool, requires_user_input: bool, requires_confirmation: bool
) -> PauseType | None:
    """What a call of a tool with these flags pauses for (None: it runs), by Agno's priority: an
    external call, then a person's input, then a confirmation. A tool and its catalog entry both
    answer with it."""
    if external_execution:
        return "external_execution"
    if requires_user_input:
        return "user_input"
    if requires_confirmation:
        return "confirmation"
    return None


#: What a requirement is: waiting for a person, decided (by a person or its deadline's policy),
#: expired (its deadline ended the run: on_timeout "error" or "cancel"), or void (its run moved on
#: without it: cancelled).
RequirementStatus = Literal["pending", "decided", "expired", "void"]
#: What the deadline of a pause does when it passes (`pause_timeout=` on the agent or the tool).
OnTimeout = Literal["reject", "approve", "cancel", "error"]
ON_TIMEOUT: tuple[OnTimeout, ...] = ("reject", "approve", "cancel", "error")
#: What the model reads of a rejected call without a note (Agno's text).
REJECTED = "Function call was rejected by the user"
#: Who a decision made by a deadline's policy is recorded as.
DEADLINE = "deadline"
#: The longest note, input value or external result a decision may carry, in characters.
DECISION_TEXT_MAX = 100_000


@dataclass(frozen=True, kw_only=True)
class ToolExecution:
    """One tool call and its result, as Agno's `ToolExecution` names them (a paused call has no
    result yet)."""

    tool_call_id: str
    tool_name: str
    tool_args: dict[str, Any] | None
    result: str | None = None
    tool_call_error: bool = False


@dataclass(frozen=True, kw_only=True)
class Decision:
    """A person's answer to one requirement. `kind`: "confirm", "reject" (with an optional
    `note` the model reads), "input" (`values`: the fields the tool asks of a person), "result"
    (`result`: what the caller's own run of an external call returned), or "budget" (`values`:
    the raised limits, `max_tokens` and/or `max_cost`)."""

    kind: Literal["confirm", "reject", "input", "result", "budget"]
    note: str | None = None
    values: dict[str, Any] | None = None
    result: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The decision as stored: only the fields it sets."""
        out: dict[str, Any] = {"kind": self.kind}
        for name in ("note", "values", "result"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Decision:
        """A decision from its stored (or sent) form; DecisionKindError if it is not one."""
        kind = value.get("kind")
        if kind not in ("confirm", "reject", "input", "result", "budget"):
            raise DecisionKindError(f"a decision's kind is one of confirm, reject, input, result, budget; got {kind!r}")
        unknown = sorted(set(value) - {"kind", "note", "values", "result"})
        if unknown:
            raise DecisionKindError(f"a decision has kind, note, values and result; unknown fields: {unknown}")
        note, values, result = value.get("note"), value.get("values"), value.get("result")
        if note is not None and not isinstance(note, str):
            raise DecisionKindError(f"a decision's note is text, got {type(note).__name__}")
        if values is not None and not isinstance(values, dict):
            raise DecisionKindError(f"a decision's values are an object of field -> value, got {type(values).__name__}")
        if result is not None and not isinstance(result, str):
            raise DecisionKindError(f"an external call's result is text, got {type(result).__name__}")
        return cls(kind=kind, note=note, values=values, result=result)

    def describe(self) -> str:
        """The decision in a few words, for a log or an error."""
        if self.kind == "reject" and self.note:
            return f"reject ({self.note[:80]!r})"
        return self.kind


@dataclass(kw_only=True)
class RunRequirement:
    """One paused call of a run (or a spent budget), and the decision it waits for: Agno's
    `RunRequirement`. Decide it with one of its mutators, then pass it to `continue_run(run_id=...,
    requirements=[...])` (or `Client.decide`). A member's requirement, read through its team,
    names the member (`member_agent_name`, `member_run_id`)."""

    id: str
    #: The run whose call this is (the member's own run for a member's pause).
    run_id: str
    tool_execution: ToolExecution | None
    pause_type: PauseType
    created_at: float
    status: RequirementStatus = "pending"
    #: When its deadline acts (UNIX seconds; None: it waits until someone decides).
    deadline_at: float | None = None
    on_timeout: OnTimeout | None = None
    #: For `user_input`: the fields asked of a person, each {"name", "type", "description", "value"}.
    user_input_schema: list[dict[str, Any]] | None = None
    #: For `budget`: which limit was spent, {"limit", "scope", "spent", "allowed"}.
    budget: dict[str, Any] | None = None
    member_agent_name: str | None = None
    member_run_id: str | None = None
    #: The decision: stored once decided, or set by a mutator here before it is sent.
    decision: Decision | None = None
    decided_by: str | None = None
    decided_at: float | None = None

    # ------------------------------------------------------------ Agno's predicates

    @property
    def needs_confirmation(self) -> bool:
        return self.pause_type == "confirmation" and not self.is_resolved()

    @property
    def needs_user_input(self) -> bool:
        return self.pause_type == "user_input" and not self.is_resolved()

    @property
    def needs_external_execution(self) -> bool:
        return self.pause_type == "external_execution" and not self.is_resolved()

    @property
    def confirmation(self) -> bool | None:
        """True when confirmed, False when rejected, None while undecided (Agno's field)."""
        kind = self.decision.kind if self.decision is not None else None
        return True if kind == "confirm" else False if kind == "reject" else None

    @property
    def confirmation_note(self) -> str | None:
        return self.decision.note if self.decision is not None else None

    @property
    def external_execution_result(self) -> str | None:
        return self.decision.result if self.decision is not None else None

    def is_resolved(self) -> bool:
        """Decided (stored), or given a decision here that is yet to be sent."""
        return self.decision is not None or self.status != "pending"

    @property
    def is_active(self) -> bool:
        """Still waiting for a person: pending, with no decision stored."""
        return self.status == "pending"

    # ------------------------------------------------------------ Agno's mutators

    def confirm(self) -> None:
        """Approve the call: it runs when the run resumes."""
        self._set(Decision(kind="confirm"))

    def reject(self, note: str | None = None) -> None:
        """Refuse the call: it does not run, and the model reads `note` (or Agno's default text)
        as its result."""
        self._set(Decision(kind="reject", note=note))

    def provide_user_input(self, values: dict[str, Any]) -> None:
        """Fill in the fields the tool asks of a person; the call then runs with them."""
        self._set(Decision(kind="input", values=dict(values)))
        for entry in self.user_input_schema or []:
            if entry["name"] in values:
                entry["value"] = values[entry["name"]]

    def set_external_execution_result(self, result: str) -> None:
        """Give the result of an external call that the caller ran itself; the model reads it."""
        self._set(Decision(kind="result", result=result))

    def raise_budget(self, *, max_tokens: int | None = None, max_cost: float | None = None) -> None:
        """Resume a run paused by its budget with a higher limit (the one that was spent)."""
        values = {k: v for k, v in (("max_tokens", max_tokens), ("max_cost", max_cost)) if v is not None}
        self._set(Decision(kind="budget", values=values))

    def _set(self, decision: Decision) -> None:
        check(self, decision)
        self.decision = decision

    def with_member(self, run_id: str, agent_name: str) -> RunRequirement:
        """This requirement as its team reads it: naming the member run it belongs to, unless a
        deeper member is named already."""
        if self.member_run_id is not None:
            return self
        return replace(self, member_run_id=run_id, member_agent_name=agent_name)


#: The decision kinds that answer each pause type.
FITS: dict[str, tuple[str, ...]] = {
    "confirmation": ("confirm", "reject"),
    "user_input": ("input", "reject"),
    "external_execution": ("result", "reject"),
    "budget": ("budget",),
}


def answered_by(decision: Decision) -> tuple[str, ...] | None:
    """The pause types `decision` answers by itself: those its kind fits, for a confirm, a reject
    or an external result whose text `check` takes; None for a decision whose check reads more of
    the requirement than its type (input against the fields asked, a budget raise against the
    spend), or that `check` refuses whatever it answers. What a decision stored in one statement
    is guarded by (`store/deciding.py`)."""
    if decision.kind in ("input", "budget") or decision.values is not None:
        return None
    if any(text is not None and len(text) > DECISION_TEXT_MAX for text in (decision.note, decision.result)):
        return None
    return tuple(asked for asked, kinds in FITS.items() if decision.kind in kinds)


def needs_the_tool(decision: Decision) -> bool:
    """Whether the decision holds only for the tool the run paused on: a confirm or an input has
    the call run, an external result answers it as that tool's. A rejection runs nothing and
    stands whatever the tool became (`orchestrator.paused_tools`)."""
    return decision.kind in ("confirm", "input", "result")


def check(requirement: RunRequirement, decision: Decision) -> None:
    """DecisionKindError unless `decision` answers what `requirement` asks."""
    kind, asked = decision.kind, requirement.pause_type
    fits = FITS[asked]
    if kind not in fits:
        takes = " or ".join(fits)
        raise DecisionKindError(
            f"requirement {requirement.id} asks for {asked.replace('_', ' ')}; a {kind!r} decision does not "
            f"answer it: send {takes}"
        )
    for text in (decision.note, decision.result):
        if text is not None and len(text) > DECISION_TEXT_MAX:
            raise DecisionKindError(f"a decision's text is at most {DECISION_TEXT_MAX} characters, got {len(text)}")
    if decision.values is not None:
        _check_storable(decision.values)
    if kind == "input":
        _check_input(requirement, decision.values or {})
    if kind == "budget":
        _check_budget(requirement, decision.values or {})


def _check_storable(values: dict[str, Any]) -> None:
    """A decision's values are JSON (as the API carries them) and no longer than its text may be."""
    try:
        text = json.dumps(values, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DecisionKindError(f"a decision's values must be JSON values (no NaN or infinity): {exc}") from None
    except RecursionError:
        raise DecisionKindError("a decision's values are nested too deeply") from None
    if len(text) > DECISION_TEXT_MAX:
        raise DecisionKindError(
            f"a decision's values are at most {DECISION_TEXT_MAX} characters as JSON, got {len(text)}"
        )


def _check_input(requirement: RunRequirement, values: dict[str, Any]) -> None:
    asked = [entry["name"] for entry in requirement.user_input_schema or []]
    unknown = sorted(set(values) - set(asked))
    missing = [name for name in asked if name not in values]
    if unknown or missing:
        raise DecisionKindError(
            f"requirement {requirement.id} asks a person for {asked}; "
            + (f"missing: {missing}" if missing else "")
            + ("; " if missing and unknown else "")
            + (f"not asked: {unknown}" if unknown else "")
        )


def _check_budget(requirement: RunRequirement, values: dict[str, Any]) -> None:
    if not values:
        raise DecisionKindError(f"requirement {requirement.id}: raise max_tokens or max_cost to resume the run")
    for name, value in values.items():
        if name not in ("max_tokens", "max_cost"):
            raise DecisionKindError(f"a budget decision raises max_tokens or max_cost, not {name!r}")
        whole = name == "max_tokens"
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)) or not value > 0:
            kind = "a whole number of tokens above 0" if whole else "a finite number above 0"
            raise DecisionKindError(f"{name} is {kind}, got {value!r}")
        if not math.isfinite(value):
            raise DecisionKindError(f"{name} is a finite number above 0, got {value!r}")
    spent = requirement.budget or {}
    limit = spent.get("limit")
    if limit in ("max_tokens", "max_cost") and limit not in values:
        raise DecisionKindError(
            f"requirement {requirement.id}: the run spent its {limit}; raise {limit} to resume it "
            f"(raise_budget({limit}=...))"
        )
    if limit in values and spent.get("spent") is not None and values[limit] <= spent["spent"]:
        raise DecisionKindError(
            f"requirement {requirement.id}: {limit} {values[limit]} is not above what the run spent "
            f"({spent['spent']}); raise it past that to resume"
        )


@dataclass(frozen=True, kw_only=True)
class PausePolicy:
    """When a pause's deadline acts and what it does: `pause_timeout=` seconds and `on_timeout=`,
    on an agent (for all its paused calls) or a tool (for its own)."""

    timeout: float | None = None
    on_timeout: OnTimeout = "reject"

    @classmethod
    def of(cls, owner: str, timeout: float | None, on_timeout: str | None) -> PausePolicy:
        """The policy checked: ConfigurationError naming `owner` if it cannot work."""
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ConfigurationError(f"{owner}: pause_timeout is a number of seconds above 0, got {timeout!r}")
        policy = on_timeout if on_timeout is not None else "reject"
        if policy not in ON_TIMEOUT:
            raise ConfigurationError(f"{owner}: on_timeout is one of {', '.join(ON_TIMEOUT)}; got {on_timeout!r}")
        return cls(timeout=None if timeout is None else float(timeout), on_timeout=policy)


def timeout_decision(requirement: RunRequirement) -> Decision | None:
    """What a requirement's deadline decides for it: a rejection or an approval, or None where the
    policy ends the run instead ("cancel", "error"). "approve" answers only a confirmation; a
    requirement of another kind is rejected (there is no input or result to make up)."""
    policy = requirement.on_timeout or "reject"
    note = "nobody decided before the deadline"
    if policy == "approve" and requirement.pause_type == "confirmation":
        return Decision(kind="confirm")
    if policy in ("approve", "reject") and requirement.pause_type != "budget":
        return Decision(kind="reject", note=f"{note}; the call was not run")
    return None


def active(requirements: list[RunRequirement]) -> list[RunRequirement]:
    """Those still waiting for a person."""
    return [r for r in requirements if r.is_active]


__all__ = [
    "DEADLINE",
    "Decision",
    "OnTimeout",
    "PausePolicy",
    "PauseType",
    "RunRequirement",
    "ToolExecution",
    "active",
    "check",
    "needs_the_tool",
    "pause_type_of",
    "timeout_decision",
]
