"""Deploying new code: which definition a run's step runs on when workers of another version
of its agent take it.

A run records the definition it started with (`RunRecord.definition_hash`, from
`orchestrator.catalog`). A worker serves one definition of each agent (its own code). When it
claims a step of a run of another definition (`steps.versions`):

1. a person accepted the worker's definition for the run (`continue_run(accept_definition=)`):
   the run takes it, whatever changed;
2. the run recorded no definition, or one no worker ever served (no catalog entry: its
   producer imported code no worker runs yet): no step ran on that one, so the run takes the
   worker's;
3. a worker of the run's definition is live (`catalog.live_seconds`: one marked it seen
   lately): the step is handed on to it (`StepRef.definition`: on Celery, a version queue that
   only the workers of that definition consume);
4. otherwise the run takes the worker's definition if nothing its next step depends on changed
   (`changes`), and else the step fails with `DefinitionChangedError` saying what changed and
   how to go on anyway.

What a step depends on: the output schema (the final answer's), whether the run is an agent or
a team, and, for each call the step still owes (the unanswered calls of a tool step), the tool
it names, by name and argument schema, with the flags that decide whether and how it runs: the
human-in-the-loop flags (unless a person decided the call already: a rejection or an external
result answers it without running it, a confirmation or an input runs it as decided) and
`at_most_once`. A team's delegation still owed needs the member it names (to one member), or
the same members (to all). Anything else may change under a run: instructions, the model,
other tools, the members a team's leader may call next, budgets, queues.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from orchestrator.catalog import Definition, ToolDefinition
from orchestrator.errors import DefinitionChangedError
from orchestrator.messages import ToolCall, decoded_arguments
from orchestrator.requirements import RunRequirement
from orchestrator.run import RunRecord
from orchestrator.team import TO_MEMBER, TO_MEMBERS, id_of

#: The flags that decide whether a call waits for a person, and what it asks.
ASKS = ("requires_confirmation", "requires_user_input", "user_input_fields", "external_execution")
#: The flags that decide how a call runs once it runs.
RUNS = ("at_most_once",)
#: How many hex digits of a definition hash name it in messages (`ratchet agents` shows as many).
SHORT = 12


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What a worker of definition `own` does with a claimed step of a run of another."""

    #: "adopt" (the run takes `own`), "hand_on" (to a worker of the run's), or "refuse".
    action: Literal["adopt", "hand_on", "refuse"]
    #: Why, for the run's log: "accepted", "unrecorded", "unknown" or "unchanged" for an adoption.
    why: str = ""
    #: What changed, for a refusal.
    changes: tuple[str, ...] = ()


def decide(
    record: RunRecord,
    own: Definition,
    served: Definition | None,
    *,
    live: bool,
    calls: Sequence[ToolCall] = (),
    decided: Mapping[str, RunRequirement] | None = None,
) -> Verdict:
    """The verdict for a step of `record` claimed by a worker of `own` (whose hash is not the
    run's): `served` is the run's definition as the catalog holds it (None: no worker ever
    served it), `live` whether a worker of it is live; `calls` the calls the step owes and
    `decided` the decided requirements among them by call id."""
    if record.accepted_definition == own.hash:
        return Verdict(action="adopt", why="accepted")
    if record.definition_hash is None:
        return Verdict(action="adopt", why="unrecorded")
    if served is None:
        return Verdict(action="adopt", why="unknown")
    if live:
        return Verdict(action="hand_on")
    found = changes(served, own, calls, decided or {})
    if found:
        return Verdict(action="refuse", changes=tuple(found))
    return Verdict(action="adopt", why="unchanged")


def changes(
    old: Definition, new: Definition, calls: Sequence[ToolCall], decided: Mapping[str, RunRequirement]
) -> list[str]:
    """What changed from `old` to `new` that a step owing `calls` depends on (none: it is safe
    to go on under `new`), each said in a few words."""
    found: list[str] = []
    if old.kind != new.kind:
        found.append(f"it is {_a(new.kind)} now, not {_a(old.kind)}")
    if old.output_schema != new.output_schema:
        found.append("its output schema changed")
    for call in calls:
        if old.kind == "team" and call.name in (TO_MEMBER, TO_MEMBERS):
            found += _delegation(old, new, call)
        else:
            found += _call(old, new, call, decided.get(call.id))
    return found


def _call(old: Definition, new: Definition, call: ToolCall, requirement: RunRequirement | None) -> list[str]:
    """What changed that the owed `call` depends on (`requirement`: its decision, if any)."""
    decision = requirement.decision.kind if requirement is not None and requirement.decision is not None else None
    if decision in ("reject", "result"):
        return []  # a person answered it: it does not run
    was, now = _tool(old, call.name), _tool(new, call.name)
    what = f"tool {call.name!r} (call {call.id})"
    if decision in ("confirm", "input"):
        # The tool as it paused (gone, its arguments, what it asks) is the decision's own check
        # when the decision is applied (`orchestrator.paused_tools`: PausedToolChangedError, the
        # decision kept for a continue); here only how it runs once it runs.
        if was is None or now is None:
            return []
        return [_flag_change(what, f, was, now) for f in RUNS if was.flags.get(f) != now.flags.get(f)]
    if was is None and now is None:
        return []  # the model called a tool neither has: answered as unknown either way
    if now is None:
        return [f"{what} was removed"]
    if was is None:
        return [f"{what} is new: the call would run, where it was answered as an unknown tool"]
    found = [f"{what}: its arguments' schema changed"] if was.parameters != now.parameters else []
    flags = (*ASKS, *RUNS)
    found += [_flag_change(what, f, was, now) for f in flags if was.flags.get(f) != now.flags.get(f)]
    return found


def _flag_change(what: str, flag: str, was: ToolDefinition, now: ToolDefinition) -> str:
    return f"{what}: its flag {flag} changed from {_said(was.flags.get(flag))} to {_said(now.flags.get(flag))}"


def _delegation(old: Definition, new: Definition, call: ToolCall) -> list[str]:
    """What changed that an owed delegation of team `old` depends on."""
    if call.name == TO_MEMBERS:
        if list(old.members) == list(new.members):
            return []
        return [
            f"delegation {call.id} to every member: the members changed from {list(old.members)} to {list(new.members)}"
        ]
    asked = str(decoded_arguments(call.arguments).get("member_id", ""))
    member = _member(old, asked)
    if member is not None and _member(new, asked) is None:
        return [f"delegation {call.id} to member {member!r}: the team has no such member any more"]
    return []


def _member(team: Definition, asked: str) -> str | None:
    """The member of `team` a delegation names (by id or name), as `TeamDefinition.member` finds it."""
    return next((m for m in team.members if asked in (m, id_of(m)) or id_of(asked) == id_of(m)), None)


def _tool(definition: Definition, name: str) -> ToolDefinition | None:
    return next((t for t in definition.tools if t.name == name), None)


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


def _said(value: object) -> str:
    return "unset" if value is None else json.dumps(value)


def refused(record: RunRecord, old: str, new: str, found: Collection[str]) -> DefinitionChangedError:
    """The error of a run whose definition `old` no live worker serves, refused by a worker of
    `new`: what changed, and how to go on anyway."""
    run_id, name = record.run_id, record.agent_name
    how = (
        f"continue it with accept_definition={new!r} (`ratchet continue {run_id} --accept-definition {new}`, "
        f'or POST /runs/{run_id}/continue with {{"accept_definition": "{new}"}})'
    )
    if record.parent_run_id is not None:
        how = (
            f"continue its team, run {record.parent_run_id}, with accept_definition={{{name!r}: {new!r}}} "
            f"(`ratchet continue {record.parent_run_id} --accept-definition {name}={new}`)"
        )
    return DefinitionChangedError(
        f"run {run_id} of {name!r} runs on definition {old[:SHORT]}, which no live worker serves any more, and "
        f"definition {new[:SHORT]}, served now, changed what its next step depends on: {'; '.join(found)}. "
        f"To go on under {new[:SHORT]} anyway, {how}; or start a worker of {old[:SHORT]} and continue it."
    )


def accepted(record: RunRecord, accept: str | Mapping[str, str] | None) -> str | None:
    """The definition a continue's `accept_definition` accepts for the run: a hash for the
    continued run itself, or a mapping of agent names to hashes for the runs of a team's tree."""
    if accept is None or isinstance(accept, str):
        return accept
    return accept.get(record.agent_name)
