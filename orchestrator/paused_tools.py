"""A paused call's tool, as it paused and as it is served now: a person's decision is applied only
to the tool it was asked about.

A requirement keeps what its tool was when the run paused: the hash of the definition the pausing
worker served, and the tool's digest (`digest`: the JSON schema of the arguments the model sees,
what a call of it pauses for, and the parameters a person fills in; not its name, nor its
description). Between the pause and the decision a deploy may change the agent: the tool removed,
renamed, no longer flagged for what the requirement asks, or taking other arguments. A decision
that holds only for that tool (a confirm or an input has the call run, an external result answers
it as the tool: `requirements.needs_the_tool`) is then refused, at two places:

- at the door (`CatalogDoor`, which `RunControl` hands `Requirements.decide`): against the newest
  live definition of the requirement's agent in the catalog, read in the decision's transaction.
  Nothing is stored: PausedToolChangedError. Where no definition is live, or the live one is
  the one that paused the run, the catalog tells nothing and the decision is stored.
- in the worker (`check`, from the tool step that applies the decisions, `steps/pausing.py`):
  against the definition the worker serves, the truth (the catalog may be stale). The run ends in
  ERROR with PausedToolChangedError, the decision kept: a continue after a deploy that serves the
  tool as it was applies it.

A rejection runs nothing and is taken at both, whatever the tool became: it is how a person moves
such a run on without cancelling it. A requirement written before tools were recorded (no digest)
is compared by name and by what it pauses for only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.agent import AgentDefinition
from orchestrator.catalog import Definition, canonical, describe, live_seconds
from orchestrator.errors import PausedToolChangedError
from orchestrator.requirements import needs_the_tool
from orchestrator.settings import Settings
from orchestrator.store.catalog_rows import CatalogRow
from orchestrator.store.requirement_rows import PausedCall
from orchestrator.tools import Tool

#: What a call of a tool does, by what it pauses for.
_DOES = {
    None: "runs without asking anyone",
    "confirmation": "asks for a confirmation",
    "user_input": "asks a person for input",
    "external_execution": "is run by the caller (external execution)",
}
#: What a paused run waits for, by its requirement's pause type.
_WAITS = {
    "confirmation": "a confirmation",
    "user_input": "a person's input",
    "external_execution": "an external result",
}
#: How many of an agent's tool names a message lists.
_NAMES = 20


@dataclass(frozen=True)
class Served:
    """A tool as a definition serves it: what a call of it pauses for (None: it runs) and its digest."""

    pause_type: str | None
    digest: str


def digest(parameters: Mapping[str, Any], pause_type: str | None, fields: Sequence[str]) -> str:
    """A tool's digest, its name left out: SHA-256 of the canonical JSON of the arguments' schema
    as the model sees it, what a call of it pauses for, and the parameters a person fills in."""
    body = {"parameters": parameters, "pauses_for": pause_type, "fields": list(fields)}
    return hashlib.sha256(canonical(body).encode()).hexdigest()


def of_tool(tool: Tool) -> str:
    """The digest of a tool a worker serves (what a pausing step records)."""
    return digest(tool.spec.parameters, tool.pause_type, tool.user_input_fields)


def served_by(agent: AgentDefinition) -> dict[str, Served]:
    """The tools an agent this process defines serves, by name."""
    return {t.name: Served(t.pause_type, of_tool(t)) for t in agent.all_tools()}


def served_in(definition: Definition) -> dict[str, Served]:
    """The tools a catalog definition serves, by name."""
    return {
        t.name: Served(t.pause_type, digest(t.parameters, t.pause_type, t.user_input_fields)) for t in definition.tools
    }


def changed(paused: PausedCall, tools: Mapping[str, Served]) -> str | None:
    """What differs between the tool `paused` paused on and the tool of that name among `tools`,
    in a clause (None: nothing does, or it paused on no tool: a budget)."""
    requirement = paused.requirement
    call = requirement.tool_execution
    if call is None:
        return None
    name, now = call.tool_name, tools.get(call.tool_name)
    if now is None:
        same = sorted(n for n, t in tools.items() if t.digest == paused.tool_digest)
        if same:
            return f"tool {name!r} is gone, and {same[0]!r} takes its arguments and asks the same (renamed?)"
        names = sorted(tools)
        listed = ", ".join(repr(n) for n in names[:_NAMES]) + (", ..." if len(names) > _NAMES else "")
        return f"tool {name!r} is gone (removed, or renamed; the agent's tools: {listed or 'none'})"
    if now.pause_type != requirement.pause_type:
        waited = _WAITS.get(requirement.pause_type, requirement.pause_type)
        return f"tool {name!r} now {_DOES[now.pause_type]}, where the run paused for {waited}"
    if paused.tool_digest is not None and now.digest != paused.tool_digest:
        return f"tool {name!r} takes other arguments now (their schema, or the fields a person fills in, changed)"
    return None


class CatalogDoor:
    """The producer's check of a decision (`store.requirement_rows.Door`): against the newest live
    definition of the requirement's agent in the catalog."""

    def __init__(self, settings: Settings) -> None:
        self.window = live_seconds(settings)

    def __call__(self, paused: PausedCall, served: CatalogRow | None) -> None:
        if served is None or served.definition_hash == paused.definition_hash:
            return  # no worker serves the agent now (the catalog cannot tell), or the one that paused
        try:
            tools = served_in(Definition.from_json(served.definition))
        except (KeyError, TypeError, ValueError):  # a row this version cannot read: the worker checks
            return
        why = changed(paused, tools)
        if why is None:
            return
        requirement = paused.requirement
        call = requirement.tool_execution
        assert call is not None
        raise PausedToolChangedError(
            f"requirement {requirement.id} of run {requirement.run_id} was not decided: in the definition of agent "
            f"{paused.agent_name!r} its workers serve now ({served.definition_hash[:12]}), {why}. The run paused on "
            f"call {call.tool_call_id} of that tool, and a decision is not applied to another one. Reject the call "
            f"instead (nothing runs; the model reads the rejection), cancel the run (`ratchet cancel "
            f"{requirement.run_id}`), or deploy code that serves the tool as it was and decide again"
        )


def check(run_id: str, agent: AgentDefinition, decided: Iterable[PausedCall]) -> None:
    """PausedToolChangedError if a decision among `decided` holds only for its tool as it paused
    and `agent`, as this worker serves it, does not serve that tool so: the run then ends in
    ERROR, its decisions kept. A decision whose run paused under this very definition is not
    compared (nothing changed)."""
    mine = describe(agent).hash
    tools: dict[str, Served] | None = None
    refused: list[str] = []
    for paused in decided:
        decision = paused.requirement.decision
        call = paused.requirement.tool_execution
        if decision is None or call is None or not needs_the_tool(decision) or paused.definition_hash == mine:
            continue
        tools = served_by(agent) if tools is None else tools
        why = changed(paused, tools)
        if why is not None:
            refused.append(
                f"call {call.tool_call_id} ({decision.describe()}, requirement {paused.requirement.id}): {why}"
            )
    if not refused:
        return
    were = "decisions were" if len(refused) > 1 else "decision was"
    raise PausedToolChangedError(
        f"run {run_id}: the {were} not applied, because agent {agent.name!r} as this worker serves it (definition "
        f"{mine[:12]}) changed the tool the run paused on: {'; '.join(refused)}. A decision is not applied to "
        f"another tool, and stays stored: deploy code that serves the tool as it was, then continue the run "
        f"(`ratchet continue {run_id}`), which applies it; or cancel the run (`ratchet cancel {run_id}`)"
    )
