"""Delegation: a team's leader hands tasks to its members, which run as durable child runs.

How one delegation goes (what a user sees of it: docs/teams.md):

1. **Start.** The leader's assistant message calls `delegate_task_to_member(member_id, task)` or
   `delegate_task_to_members(task)`. The team's tool step runs the batch's other tools first;
   then `start_members`, in the one transaction that commits their results, writes a QUEUED
   child run per member (`parent_run_id`, `parent_tool_call_id`, the task as its user message,
   the team's session) and parks the team RUNNING -> WAITING. The children's first steps are
   published after the commit (their outbox marker covers a crash in between). The team holds
   no worker while it waits.
2. **Members** run like any run, with their own model-call and tool-batch tasks on the pool.
3. **Fan-in.** A fan-in runs in the same transaction as a member's final commit when it
   completes (`commit_and_fan_in`: no gap for a crash to fall into), and in the transaction
   after the ERROR row when it fails (`fan_in_now`). Under the team row's lock the store hands
   `decide` the team's messages and member runs; `decide` looks at the delegation calls the team
   still owes: when every member of every call has ended, one tool result per call (a
   `delegate_task_to_members` call gets all its members' answers in one result), which the store
   appends as it moves the team WAITING -> QUEUED for the leader's next model call; when a member
   ended in ERROR, the error that moves the team WAITING -> ERROR, naming the member run, and a
   team that is itself a member passes that on to its own team.
4. **A person in the loop.** A member (at any depth) that pauses moves every WAITING team above
   it to PAUSED in its pause's commit (`store/paused.py`); its last decision moves them back to
   WAITING. A team PAUSED for its members is fanned in as a WAITING one: a member that completes
   meanwhile is kept for the fan-in (the paused member is live, so nothing moves yet), one that
   fails puts the team in ERROR at once (the paused member waits on for its decision), and a
   team none of whose runs waits for a person any more (its paused member was cancelled or
   failed) goes back to WAITING or on. A team in ERROR continued while a member is paused goes
   to PAUSED. A leader's own paused call holds back its batch's delegations (`steps/tools.py`).
5. **Recovery.** The sweeper fans in (`fan_in_now`) the teams a crash left WAITING with every
   member ended (a worker killed between a member's ERROR row and its fan-in), and those left
   PAUSED with no member PAUSED any more.
6. **Producers.** `orchestrator.control` continues a team in ERROR by continuing its failed
   members in place, moving the team ERROR -> WAITING and fanning in (`fan_in_now`), so the
   leader resumes and completed members are not re-run; it cancels a team's members with the
   team, and fans in a member cancelled on its own, whose team reads a tool error for it.

This module holds no connection and publishes nothing: the store (`Store.teams`) owns the transactions and
statements, and the steps to publish (`start_members`, `wake_step`) go back to its caller, the
engine, the sweeper or the run control.

Exactly once: the team's results are appended only by the move out of WAITING (or PAUSED), which
one transaction wins (PostgreSQL: the lock of the tree's top run, taken first by every fan-in,
pause and decision, serialises them, so none deadlocks another; SQLite: BEGIN IMMEDIATE does),
and the unique index on (run_id, tool_call_id) refuses a second result for a call if all else
failed.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from orchestrator import tracing
from orchestrator.agent import AgentDefinition, get_agent
from orchestrator.catalog import describe
from orchestrator.errors import MemberRunError, RatchetError, ToolArgumentsError
from orchestrator.messages import Message, ToolCall, unanswered_calls
from orchestrator.ports import StepRef
from orchestrator.routing import step_of
from orchestrator.run import RunRecord
from orchestrator.state import StateChange
from orchestrator.status import RunStatus
from orchestrator.store import Claim, Store
from orchestrator.store.teams import LIVE, FanIn, NewMember
from orchestrator.team import DELEGATION_TOOLS, TO_MEMBER, TeamDefinition

log = logging.getLogger("ratchet.delegation")
S = RunStatus


@dataclass(frozen=True, kw_only=True)
class Delegation:
    """One delegation call of the leader and the members it goes to."""

    call: ToolCall
    task: str
    members: tuple[AgentDefinition, ...]


# ---------------------------------------------------------------- start


def split(agent: AgentDefinition, calls: Sequence[ToolCall]) -> tuple[list[ToolCall], list[Delegation]]:
    """Separate a batch into the calls the tool step runs itself and the delegations it starts.

    A delegation call with invalid arguments or an unknown member stays with the ordinary
    calls: its tool function turns it into a tool error the leader can read and correct."""
    if not isinstance(agent, TeamDefinition) or not agent.members:
        return list(calls), []
    inline: list[ToolCall] = []
    delegated: list[Delegation] = []
    for call in calls:
        tool = agent.tool(call.name) if call.name in DELEGATION_TOOLS else None
        if tool is None:
            inline.append(call)
            continue
        try:
            args = tool.parse_arguments(call.arguments)
        except ToolArgumentsError:
            inline.append(call)
            continue
        if call.name == TO_MEMBER:
            member = agent.member(str(args["member_id"]))
            if member is None:
                inline.append(call)
                continue
            targets: tuple[AgentDefinition, ...] = (member,)
        else:
            targets = tuple(agent.members)
        delegated.append(Delegation(call=call, task=str(args["task"]), members=targets))
    return inline, delegated


def start_members(
    store: Store,
    claim: Claim,
    results: Sequence[Message],
    delegations: Sequence[Delegation],
    *,
    publish_grace: float,
    state_changes: Sequence[StateChange] = (),
) -> list[StepRef]:
    """Commit the batch's last results (and what their calls changed in the session's state),
    create the member runs and park the team WAITING, all in one transaction fenced by the claim
    (`Teams.start_members`: a streamed team's members are streamed too; members run for the
    team's user). Returns the members' first steps to publish."""
    new = [
        NewMember(
            run_id=str(uuid.uuid4()),
            agent_name=member.name,
            kind=member.kind,
            task=d.task,
            parent_tool_call_id=d.call.id,
            definition_hash=describe(member).hash,
        )
        for d in delegations
        for member in d.members
    ]
    members = store.teams.start_members(
        claim, results, new, publish_grace=publish_grace, starting=_starting, state_changes=state_changes
    )
    log.info("run %s: delegated to %s", claim.run_id, ", ".join(f"{m.agent_name} ({m.run_id})" for m in members))
    return [step_of(m) for m in members]


def _starting(member: NewMember, team: RunRecord) -> AbstractContextManager[str | None]:
    # In the trace of the leader's step (or of the team, where this worker traces nothing).
    return tracing.starting(member.agent_name, member.run_id, team=team)


# ---------------------------------------------------------------- fan-in


def decide(team: RunRecord, messages: list[Message], members: list[RunRecord]) -> FanIn | None:
    """What a fan-in does to the WAITING `team` (or PAUSED for its members), from its messages and
    its member runs (oldest first): None while a call it owes has a live member (a PAUSED one
    included) and none failed; else the results of
    the calls whose members all ended, and the team's error if one ended in ERROR (the team
    stops then, not when the member's siblings are done)."""
    by_call: dict[str, list[RunRecord]] = defaultdict(list)
    for child in members:
        if child.parent_tool_call_id is not None:
            by_call[child.parent_tool_call_id].append(child)
    results: list[Message] = []
    failed: list[RunRecord] = []
    waiting = False
    for call in unanswered_calls(messages):
        called = by_call.get(call.id, [])
        errored = [m for m in called if m.status == S.ERROR]
        if errored:
            failed += errored
        elif any(m.status in LIVE for m in called):
            waiting = True
        else:
            results.append(_result(call, _in_member_order(team, called)))
    if failed:
        return FanIn(results=results, error=_member_error(failed), member_run_id=failed[0].run_id)
    return None if waiting else FanIn(results=results)


def _member_error(failed: list[RunRecord]) -> dict[str, str]:
    first = failed[0]
    more = f" (and {len(failed) - 1} more member runs in ERROR)" if len(failed) > 1 else ""
    return MemberRunError(
        f"member run {first.run_id} ({first.agent_name}) ended in ERROR: "
        f"{first.error_type or 'Error'}: {first.error_message or ''}{more}"
    ).to_record()


def commit_and_fan_in(
    store: Store,
    claim: Claim,
    new_messages: Sequence[Message],
    *,
    status: RunStatus,
    publish_grace: float,
    content: str | None = None,
    system_message: str | None = None,
) -> tuple[RunRecord, RunRecord | None]:
    """A member's final commit and its team's fan-in in one transaction (no crash between):
    the member's row, and the team's as the fan-in left it (`wake_step` of it to publish)."""
    return store.teams.commit_step_and_fan_in(
        claim,
        new_messages,
        decide,
        status=status,
        next_step=None,
        publish_grace=publish_grace,
        content=content,
        system_message=system_message,
    )


def wake_step(team: RunRecord | None) -> StepRef | None:
    """The leader's step to publish after a fan-in that moved the team to QUEUED."""
    if team is None or team.status != S.QUEUED or team.next_step is None:
        return None
    return step_of(team)


def fan_in_now(store: Store, team_run_id: str, *, publish_grace: float) -> RunRecord | None:
    """Move a WAITING team (or one PAUSED for its members) on if its members allow it (`decide`),
    in a transaction of its own.

    Returns the team's row after the move (QUEUED: publish `wake_step` of it; ERROR: nothing to
    publish; a team that is itself a member fails its own team too; WAITING or PAUSED: whether a
    run under it waits for a person changed), or None when nothing moved (members still live)."""
    return store.teams.fan_in(team_run_id, decide, publish_grace=publish_grace)


def after_member_final(
    store: Store, run_id: str, *, publish_grace: float, record: RunRecord | None = None
) -> RunRecord | None:
    """After a run ended outside a model step's commit (ERROR, cancel): fan in to its team.

    A member that COMPLETED was fanned in by its own final commit already, and one that PAUSED
    moved its teams to PAUSED in its own commit (nothing to fan in while it is live). `record`:
    the run as its final move left it, if the caller has it (one read fewer)."""
    record = record if record is not None else store.get_record(run_id)
    if record.parent_run_id is None or record.status == S.COMPLETED or record.status in LIVE:
        return None
    return fan_in_now(store, record.parent_run_id, publish_grace=publish_grace)


def _result(call: ToolCall, members: Sequence[RunRecord]) -> Message:
    """The tool result of one delegation call, from its members' rows."""
    answers = [_answer(m) for m in members]
    if not members:  # cannot happen short of a hand-edited database; never leave the leader hanging
        content, error = "no member run was started for this call", True
    elif call.name == TO_MEMBER and len(members) == 1:
        content, error = answers[0]
    else:
        # Agno's delegate_task_to_members labels each member's answer.
        content = "\n\n".join(
            f"{'Team' if m.kind == 'team' else 'Agent'} {m.agent_name}: {text}"
            for m, (text, _) in zip(members, answers, strict=True)
        )
        error = all(e for _, e in answers)
    return Message(
        role="tool",
        tool_call_id=call.id,
        tool_name=call.name,
        tool_args=call.arguments_dict(),
        content=content,
        tool_call_error=error,
    )


def _answer(member: RunRecord) -> tuple[str, bool]:
    if member.status == S.COMPLETED:
        return member.content or "", False
    status = member.status.value.lower()
    return f"member run {member.run_id} ({member.agent_name}) was {status} before it answered", True


def _in_member_order(team: RunRecord, members: list[RunRecord]) -> list[RunRecord]:
    # Member rows share a creation time; the team's own order reads best for the leader.
    try:
        order = {m.name: i for i, m in enumerate(getattr(get_agent(team.agent_name), "members", []))}
    except RatchetError:
        order = {}
    return sorted(members, key=lambda m: (order.get(m.agent_name, len(order)), m.agent_name, m.run_id))
