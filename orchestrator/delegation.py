"""Delegation: a team's leader hands tasks to its members, which run as durable child runs.

How one delegation goes (DESIGN.md, "Teams"):

1. **Start.** The leader's assistant message calls `delegate_task_to_member(member_id, task)` or
   `delegate_task_to_members(task)`. The team's tool step runs the batch's other tools first;
   then `start_members`, in the one transaction that commits their results, writes a QUEUED
   child run per member (`parent_run_id`, `parent_tool_call_id`, the task as its user message,
   the team's session) and parks the team RUNNING -> WAITING. The children's first steps are
   published after the commit (their outbox marker covers a crash in between). The team holds
   no worker while it waits.
2. **Members** run like any run, with their own model-call and tool-batch tasks on the pool.
3. **Fan-in.** `fan_in` runs in the same transaction as a member's final commit when it
   completes (no gap for a crash to fall into), and in the transaction after the ERROR row when
   it fails. Under the team row's lock it looks at the delegation calls the team still owes:
   when every member of every call has ended, it appends one tool result per call (a
   `delegate_task_to_members` call gets all its members' answers in one result) and moves the
   team WAITING -> QUEUED for the leader's next model call; when a member ended in ERROR it
   moves the team WAITING -> ERROR, naming the member run and its error, and a team that is
   itself a member passes that on to its own team.
4. **Recovery.** The sweeper fans in (`fan_in_now`) the teams a crash left WAITING with every
   member ended (a worker killed between a member's ERROR row and its fan-in).
5. **Producers.** `orchestrator.control` continues a team in ERROR by continuing its failed
   members in place, moving the team ERROR -> WAITING and fanning in (`fan_in_now`), so the
   leader resumes and completed members are not re-run; it cancels a team's members with the
   team, and fans in a member cancelled on its own, whose team reads a tool error for it.

This module works on the store alone and publishes nothing: it returns the steps to publish
(`start_members`, `wake_step`) to its caller, the engine, the sweeper or the run control.

Exactly once: the team's results are appended only by the move out of WAITING, which one
transaction wins (PostgreSQL: the row lock serialises; SQLite: BEGIN IMMEDIATE does), and the
unique index on (run_id, tool_call_id) refuses a second result for a call if all else failed.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection

from orchestrator import tracing
from orchestrator.agent import AgentDefinition, get_agent
from orchestrator.errors import MemberRunError, RatchetError, ToolArgumentsError
from orchestrator.messages import Message, ToolCall, unanswered_calls
from orchestrator.ports import StepRef
from orchestrator.routing import step_of
from orchestrator.run import RunRecord
from orchestrator.state import StateChange
from orchestrator.status import RunStatus
from orchestrator.store import Claim, Store, writes
from orchestrator.store.tables import runs
from orchestrator.store.teams import LIVE, lock_run
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
    (a streamed team's members are streamed too; members run for the team's user). Returns the
    members' first steps to publish."""
    with store.engine.begin() as conn:
        team = store.commit_step(
            claim, results, status=S.WAITING, next_step=None, publish_grace=publish_grace,
            state_changes=state_changes, conn=conn,
        )  # fmt: skip
        members: list[RunRecord] = []
        for d in delegations:
            for member in d.members:
                run_id = str(uuid.uuid4())
                # In the trace of the leader's step (or of the team, where this worker traces nothing).
                with tracing.starting(member.name, run_id, team=team) as trace_context:
                    created = store.create_run(
                        run_id=run_id, session_id=team.session_id, agent_name=member.name,
                        kind=member.kind, input_messages=[Message(role="user", content=d.task)],
                        publish_grace=publish_grace, parent_run_id=team.run_id, parent_tool_call_id=d.call.id,
                        stream=team.stream, user_id=team.user_id, priority=team.priority,
                        trace_context=trace_context, conn=conn,
                    )  # fmt: skip
                members.append(created)
        store.log_event(
            conn, team.run_id, "delegate", team.seq, members={m.run_id: m.agent_name for m in members},
            **writes.position(team),
        )  # fmt: skip
    log.info("run %s: delegated to %s", team.run_id, ", ".join(f"{m.agent_name} ({m.run_id})" for m in members))
    return [step_of(m) for m in members]


# ---------------------------------------------------------------- fan-in


def fan_in(store: Store, conn: Connection, team_run_id: str, *, publish_grace: float) -> RunRecord | None:
    """In the caller's transaction: move a WAITING team on if its members allow it.

    Returns the team's row after the move (QUEUED: publish `wake_step` of it after the commit;
    ERROR: nothing to publish), or None when nothing moved (not WAITING, members still live)."""
    team = lock_run(conn, team_run_id)
    if team is None or team.status != S.WAITING:
        return None
    owed = unanswered_calls(store.get_messages(team_run_id, conn))
    by_call: dict[str, list[RunRecord]] = defaultdict(list)
    for child in store.children(team_run_id, conn):
        if child.parent_tool_call_id is not None:
            by_call[child.parent_tool_call_id].append(child)
    results: list[Message] = []
    failed: list[RunRecord] = []
    waiting = False
    for call in owed:
        members = by_call.get(call.id, [])
        errored = [m for m in members if m.status == S.ERROR]
        if errored:  # the team stops now, not when the member's siblings are done
            failed += errored
        elif any(m.status in LIVE for m in members):
            waiting = True
        else:
            results.append(_result(call, _in_member_order(team, members)))
    if failed:
        return _fail_team(store, conn, team, failed, results, publish_grace=publish_grace)
    if waiting:
        return None
    return store.move(
        team_run_id, src=(S.WAITING,), dst=S.QUEUED, event="fan_in", new_messages=results, conn=conn,
        seq=runs.c.seq + 1, next_step="model", attempts=0, retries=0, publish_grace=publish_grace,
    )  # fmt: skip


def _fail_team(
    store: Store,
    conn: Connection,
    team: RunRecord,
    failed: list[RunRecord],
    results: list[Message],
    *,
    publish_grace: float,
) -> RunRecord | None:
    first = failed[0]
    more = f" (and {len(failed) - 1} more member runs in ERROR)" if len(failed) > 1 else ""
    error = MemberRunError(
        f"member run {first.run_id} ({first.agent_name}) ended in ERROR: "
        f"{first.error_type or 'Error'}: {first.error_message or ''}{more}"
    ).to_record()
    # The answers of members that did finish are kept, so a continue re-runs none of them.
    moved = store.move(
        team.run_id, src=(S.WAITING,), dst=S.ERROR, new_messages=results, conn=conn,
        error_type=error["type"], error_message=error["message"], next_step=None,
    )  # fmt: skip
    if moved is not None:
        where = writes.position(moved)
        store.log_event(conn, team.run_id, "error", moved.seq, member_run_id=first.run_id, **error, **where)
        if moved.parent_run_id is not None:
            # A team that is itself a member fails its own team too (leaf before ancestor: the
            # same lock order as every fan-in, so no deadlock).
            fan_in(store, conn, moved.parent_run_id, publish_grace=publish_grace)
    return moved


def wake_step(team: RunRecord | None) -> StepRef | None:
    """The leader's step to publish after a fan-in that moved the team to QUEUED."""
    if team is None or team.status != S.QUEUED or team.next_step is None:
        return None
    return step_of(team)


def fan_in_now(store: Store, team_run_id: str, *, publish_grace: float) -> RunRecord | None:
    """`fan_in` in a transaction of its own."""
    with store.engine.begin() as conn:
        return fan_in(store, conn, team_run_id, publish_grace=publish_grace)


def after_member_final(
    store: Store, run_id: str, *, publish_grace: float, record: RunRecord | None = None
) -> RunRecord | None:
    """After a run ended outside a model step's commit (ERROR, cancel): fan in to its team.

    A member that COMPLETED was fanned in by its own final commit already. `record`: the run
    as its final move left it, if the caller has it (one read fewer)."""
    record = record if record is not None else store.get_record(run_id)
    if record.parent_run_id is None or record.status == S.COMPLETED:
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
        role="tool", tool_call_id=call.id, tool_name=call.name, tool_args=call.arguments_dict(),
        content=content, tool_call_error=error,
    )  # fmt: skip


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
