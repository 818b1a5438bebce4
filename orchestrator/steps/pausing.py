"""The tool step's side of a person in the loop: which owed calls run, which are answered by a
decision, and which pause the run (`orchestrator.requirements`).

A call of a tool flagged `requires_confirmation`, `requires_user_input` or `external_execution`
runs only once a person decided it: confirmed (it runs as any call, at-most-once and idempotency
key included), given its input (it runs with the person's values in place of the model's for
those fields), rejected (the model reads the note as its result) or given an external result
(the model reads that). A flagged call without a decision pauses the run. The decisions are read
for a batch with a flagged call or a call of a tool this worker does not serve, or of a run
started under another definition than the worker's (`sort`), so that a decision stored before a
deploy changed a tool still decides its call: a rejection stands, and a decision that holds only
for the tool as it paused (a confirm, an input, an external result) ends the run in ERROR if this
worker serves it otherwise (`orchestrator.paused_tools`), never applied to another tool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from orchestrator import catalog, paused_tools
from orchestrator.agent import AgentDefinition
from orchestrator.messages import Message, ToolCall
from orchestrator.requirements import REJECTED, RunRequirement
from orchestrator.run import RunRecord
from orchestrator.store import Store
from orchestrator.store.paused import Asked
from orchestrator.untrusted import TOOL_NAME_MAX, storable_name, storable_text


@dataclass(kw_only=True)
class Sorted:
    """An owed batch sorted: the calls to run (a person's input merged in), the results the
    decisions give, and the calls that pause the run."""

    run: list[ToolCall] = field(default_factory=list)
    answered: list[Message] = field(default_factory=list)
    paused: list[ToolCall] = field(default_factory=list)


def sort(store: Store, agent: AgentDefinition, run: RunRecord, calls: list[ToolCall]) -> Sorted:
    """Sort the owed `calls` of the run by what a person decided of them. A stored decision wins
    over the tool's flags as they are now: a call rejected before a deploy dropped its tool's flag
    is still not run, and a call confirmed before a deploy changed its tool is not run at all
    (PausedToolChangedError, `paused_tools.check`). So the decisions are read when a call's tool
    is flagged or unknown here, or when the run started under another definition than this
    worker's (or an unknown one); a run of this very definition whose calls are all of unflagged
    tools has none to read."""
    if not calls:
        return Sorted()
    flagged = any((t := agent.tool(c.name)) is None or t.pause_type is not None for c in calls)
    if not flagged and run.definition_hash == catalog.describe(agent).hash:
        return Sorted(run=list(calls))
    decided = store.requirements.decided(run.run_id, [c.id for c in calls])
    paused_tools.check(run.run_id, agent, decided.values())
    out = Sorted()
    for call in calls:
        paused = decided.get(call.id)
        requirement = paused.requirement if paused is not None else None
        tool = agent.tool(call.name)
        if requirement is not None and requirement.decision is not None:
            _apply(agent, call, requirement, out)
        elif tool is not None and tool.pause_type is not None:
            out.paused.append(call)
        else:
            out.run.append(call)
    return out


def _apply(agent: AgentDefinition, call: ToolCall, requirement: RunRequirement, out: Sorted) -> None:
    decision = requirement.decision
    assert decision is not None
    if decision.kind == "confirm":
        out.run.append(call)
    elif decision.kind == "input":
        tool = agent.tool(call.name)
        asked = set(tool.user_input_fields) if tool is not None else set()
        model = {k: v for k, v in call.arguments_dict().items() if k not in asked}
        out.run.append(call.model_copy(update={"arguments": json.dumps({**model, **(decision.values or {})})}))
    elif decision.kind == "result":
        out.answered.append(_answer(call, decision.result or "", error=False))
    else:  # rejected
        out.answered.append(_answer(call, decision.note or REJECTED, error=True))


def _answer(call: ToolCall, content: str, *, error: bool) -> Message:
    return Message(
        role="tool",
        tool_call_id=call.id,
        tool_name=storable_name(call.name, TOOL_NAME_MAX),
        tool_args=call.arguments_dict(),
        tool_call_error=error,
        content=storable_text(content),
    )


def asked(agent: AgentDefinition, calls: list[ToolCall], now: float) -> list[Asked]:
    """The requirements the paused `calls` write: what each asks, and its deadline."""
    out: list[Asked] = []
    for call in calls:
        tool = agent.tool(call.name)
        assert tool is not None and tool.pause_type is not None
        policy = agent.pause_policy_of(tool)
        args = call.arguments_dict()
        served = catalog.describe(agent).hash
        if tool.requires_user_input:
            args = {k: v for k, v in args.items() if k not in tool.user_input_fields}
        out.append(
            Asked(
                pause_type=tool.pause_type,
                tool_call_id=call.id,
                tool_name=call.name,
                tool_args=args,
                detail={"fields": tool.user_input_schema()} if tool.requires_user_input else None,
                deadline_at=now + policy.timeout if policy.timeout is not None else None,
                on_timeout=policy.on_timeout if policy.timeout is not None else None,
                definition_hash=served,
                tool_digest=paused_tools.of_tool(tool),
            )
        )
    return out
