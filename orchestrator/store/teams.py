"""The store's side of teams (`Store.teams`): member runs started, and the fan-in applied.

`orchestrator.delegation` decides what a delegation means (which members a call goes to, what
their answers say to the leader, when a failed member fails its team); this component owns the
transactions and statements that carry it out, so no caller ever holds a connection:

- `start_members`: the team's batch committed, its member runs written and the team parked
  WAITING, in one transaction fenced by the team's claim;
- `fan_in`: under the lock of the tree's top run (taken first, as a pause and a decision take it:
  `paused.lock_root`), then the team row's, the team's owed calls and its members' rows handed to
  the caller's `Decide`, and the `FanIn` it returns applied as one guarded move (WAITING -> QUEUED
  with the results, or WAITING -> ERROR naming the failed member, then that team's own team; a
  team PAUSED for its members moves the same way, and back to WAITING once no run under it
  waits for a person);
- `commit_step_and_fan_in`: a member's final commit and its team's fan-in in one transaction;
- `to_fan_in`: the teams a crash left WAITING with every member ended, or PAUSED with no member
  PAUSED (the sweeper's search).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection, and_, exists, not_, or_, select
from sqlalchemy.orm import aliased

from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.state import StateChange
from orchestrator.status import RunStatus
from orchestrator.store import writes
from orchestrator.store.backend import Backend
from orchestrator.store.claims import Claim
from orchestrator.store.tables import runs
from orchestrator.store.trees import ancestors, lock_root, lock_run, release, waiting_below

if TYPE_CHECKING:
    from orchestrator.store.store import Store

S = RunStatus
#: Statuses in which a member run may still end by itself.
LIVE = (S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED)


@dataclass(frozen=True, kw_only=True)
class NewMember:
    """A member run a delegation starts; the rest of its row (session, user, stream, priority,
    parent) is its team's."""

    run_id: str
    agent_name: str
    kind: str
    #: The task the leader gave it: the member's user message.
    task: str
    #: The leader's delegation call this member answers.
    parent_tool_call_id: str
    #: The hash of the member's definition as the leader's worker knows it (`orchestrator.catalog`).
    definition_hash: str | None = None


@dataclass(frozen=True, kw_only=True)
class FanIn:
    """What a fan-in does to a WAITING team (or one PAUSED for its members): append `results`
    (one tool result per call whose members all ended), and with `error` (a member failed:
    `MemberRunError.to_record()`, naming `member_run_id`) move the team to ERROR instead of
    QUEUED."""

    results: list[Message]
    error: dict[str, str] | None = None
    member_run_id: str | None = None


#: The caller's decision, from the team's row, its messages and its member runs (oldest first):
#: the fan-in to apply, or None while members it waits for are live. A pure function: it runs
#: under the team row's lock.
Decide = Callable[[RunRecord, list[Message], list[RunRecord]], FanIn | None]
#: Around the write of each member run: the trace context to store with it (`tracing.starting`).
Starting = Callable[[NewMember, RunRecord], AbstractContextManager[str | None]]


class Teams:
    """The writes and reads of team runs and their members, on the store's guarded moves."""

    def __init__(self, store: Store, backend: Backend) -> None:
        self.store = store
        self._backend = backend

    def start_members(
        self,
        claim: Claim,
        results: Sequence[Message],
        members: Sequence[NewMember],
        *,
        publish_grace: float,
        starting: Starting,
        state_changes: Sequence[StateChange] = (),
    ) -> list[RunRecord]:
        """Commit the team's batch's last `results` (and what their calls changed in the session's
        state), write the `members` QUEUED and park the team WAITING, in one transaction fenced by
        the claim, and log the delegation. Returns the members' rows, whose first steps the caller
        publishes."""
        store = self.store
        with store.engine.begin() as conn:
            team = store.commit_step(
                claim,
                results,
                status=S.WAITING,
                next_step=None,
                publish_grace=publish_grace,
                state_changes=state_changes,
                conn=conn,
            )
            created: list[RunRecord] = []
            for member in members:
                with starting(member, team) as trace_context:
                    created.append(self._create_member(conn, team, member, publish_grace, trace_context))
            detail = {m.run_id: m.agent_name for m in created}
            store.log_event(conn, team.run_id, "delegate", team.seq, members=detail, **writes.position(team))
        return created

    def _create_member(
        self, conn: Connection, team: RunRecord, member: NewMember, publish_grace: float, trace_context: str | None
    ) -> RunRecord:
        # Members run for the team's user, in its session; a streamed team's members are streamed too.
        return self.store.create_run(
            run_id=member.run_id,
            session_id=team.session_id,
            agent_name=member.agent_name,
            kind=member.kind,
            input_messages=[Message(role="user", content=member.task)],
            publish_grace=publish_grace,
            parent_run_id=team.run_id,
            parent_tool_call_id=member.parent_tool_call_id,
            stream=team.stream,
            user_id=team.user_id,
            priority=team.priority,
            trace_context=trace_context,
            definition_hash=member.definition_hash,
            conn=conn,
        )

    def fan_in(self, team_run_id: str, decide: Decide, *, publish_grace: float) -> RunRecord | None:
        """Move a WAITING team on if `decide` says its members allow it, in a transaction of its
        own. The team's row after the move (QUEUED: the caller publishes its leader's step;
        ERROR: nothing to publish), or None when nothing moved."""
        with self.store.engine.begin() as conn:
            root = lock_root(conn, team_run_id)
            return self._fan_in(conn, team_run_id, root, decide, publish_grace)

    def commit_step_and_fan_in(
        self,
        claim: Claim,
        new_messages: Sequence[Message],
        decide: Decide,
        *,
        status: RunStatus,
        next_step: str | None,
        publish_grace: float,
        content: str | None = None,
        system_message: str | None = None,
    ) -> tuple[RunRecord, RunRecord | None]:
        """A member's final commit (`Store.commit_step`) and its team's fan-in in one
        transaction, so no crash falls between them: the member's row, and its team's as
        `fan_in` left it. Keeps the messages in this process's transcript cache once committed."""
        team_run_id = claim.record.parent_run_id
        assert team_run_id is not None, "only a member run has a team to fan in"
        with self.store.engine.begin() as conn:
            root = lock_root(conn, team_run_id)  # before the member's own row: the tree's lock order
            committed = self.store.commit_step(
                claim,
                new_messages,
                status=status,
                next_step=next_step,
                publish_grace=publish_grace,
                content=content,
                system_message=system_message,
                conn=conn,
            )
            team = self._fan_in(conn, team_run_id, root, decide, publish_grace)
        self.store.remember(committed, new_messages)
        return committed, team

    def fan_in_within(
        self, conn: Connection, team_run_id: str, decide: Decide, *, publish_grace: float
    ) -> RunRecord | None:
        """`fan_in` in the store's caller's transaction `conn` (a commit of the store's own
        that carries it; tests that interleave two transactions)."""
        root = lock_root(conn, team_run_id)
        return self._fan_in(conn, team_run_id, root, decide, publish_grace)

    def _fan_in(
        self, conn: Connection, team_run_id: str, root: str, decide: Decide, publish_grace: float
    ) -> RunRecord | None:
        """The fan-in under the lock of the tree's `root`, which the caller took first. A team
        PAUSED for its members (not for a call of its own: `next_step` is None) is fanned in as a
        WAITING one: a failed member fails it, members that all ended queue its leader; while
        members run and none waits for a person any more (the paused one was cancelled or
        failed), it goes back to WAITING."""
        store = self.store
        team = lock_run(conn, team_run_id)
        paused = team is not None and team.status == S.PAUSED and team.next_step is None
        if team is None or (team.status != S.WAITING and not paused):
            return None
        children = store.children(team_run_id, conn)
        fan_in = decide(team, store.get_messages(team_run_id, conn), children)
        if fan_in is None:
            return self._settle(conn, team, root, children)
        if fan_in.error is not None:
            return self._fail_team(conn, team, root, fan_in, decide, publish_grace)
        moved = store.move(
            team_run_id,
            src=(team.status,),
            dst=S.QUEUED,
            event="fan_in",
            new_messages=fan_in.results,
            conn=conn,
            seq=runs.c.seq + 1,
            next_step="model",
            attempts=0,
            retries=0,
            model_index=None,
            publish_grace=publish_grace,
        )
        if moved is not None and paused:
            release(conn, store, ancestors(conn, moved), root)  # teams above paused for this one alone
        return moved

    def _settle(self, conn: Connection, team: RunRecord, root: str, children: list[RunRecord]) -> RunRecord | None:
        """A team whose members are still live: PAUSED exactly while a run under it waits for a
        person. A PAUSED team none waits under any more goes back to WAITING (with its teams);
        a WAITING one with a paused member (a team in ERROR continued meanwhile) goes to PAUSED
        (with its teams). None when it stays as it is."""
        if team.status == S.PAUSED:
            if waiting_below(conn, root, team.run_id):
                return None
            released = release(conn, self.store, [team, *ancestors(conn, team)], root)
            return released[0] if released and released[0].run_id == team.run_id else None
        if not any(c.status == S.PAUSED for c in children) or not waiting_below(conn, root, team.run_id):
            return None
        moved = self.store.move(team.run_id, src=(S.WAITING,), dst=S.PAUSED, event="paused", conn=conn)
        for above in ancestors(conn, team):
            self.store.move(above.run_id, src=(S.WAITING,), dst=S.PAUSED, event="paused", conn=conn)
        return moved

    def _fail_team(
        self, conn: Connection, team: RunRecord, root: str, fan_in: FanIn, decide: Decide, publish_grace: float
    ) -> RunRecord | None:
        assert fan_in.error is not None
        error = fan_in.error
        # The answers of members that did finish are kept, so a continue re-runs none of them.
        # A team PAUSED on another member fails too: a member's failure stops its team at once,
        # as in WAITING; the paused member waits on for its decision (its answer is kept).
        moved = self.store.move(
            team.run_id,
            src=(team.status,),
            dst=S.ERROR,
            new_messages=fan_in.results,
            conn=conn,
            error_type=error["type"],
            error_message=error["message"],
            next_step=None,
        )
        if moved is not None:
            where = writes.position(moved)
            detail = {"member_run_id": fan_in.member_run_id, **error, **where}
            self.store.log_event(conn, team.run_id, "error", moved.seq, **detail)
            if moved.parent_run_id is not None:
                # A team that is itself a member fails its own team too (under the same root lock).
                self._fan_in(conn, moved.parent_run_id, root, decide, publish_grace)
        return moved

    def to_fan_in(self, *, limit: int = 200) -> list[str]:
        """WAITING runs whose fan-in is due: no delegated member is live any more, or one ended in
        ERROR; and runs PAUSED for their members of which none is PAUSED any more (cancelled or
        failed between its move and the fan-in), or one ended in ERROR. A fan-in that ran leaves
        its team QUEUED, WAITING or ERROR, so these are the ones a crash interrupted (or that are
        being fanned in right now: doing it again is a no-op). A read, on the quick pool (on
        SQLite a plain BEGIN, not the write lock every sweep)."""
        return self._backend.quick(lambda conn: teams_to_fan_in(conn, limit=limit))


def teams_to_fan_in(conn: Connection, *, limit: int = 200) -> list[str]:
    """`Teams.to_fan_in` as a function of a connection."""
    child = aliased(runs)
    delegated = and_(child.c.parent_run_id == runs.c.run_id, child.c.parent_tool_call_id.is_not(None))
    live = exists().where(delegated, child.c.status.in_([s.value for s in LIVE]))
    failed = exists().where(delegated, child.c.status == S.ERROR.value)
    paused = exists().where(delegated, child.c.status == S.PAUSED.value)
    waiting = and_(runs.c.status == S.WAITING.value, or_(not_(live), failed))
    # PAUSED for its members (not for a call of its own) with no member PAUSED any more.
    paused_for_none = and_(runs.c.status == S.PAUSED.value, runs.c.next_step.is_(None), or_(not_(paused), failed))
    rows = conn.execute(
        select(runs.c.run_id).where(or_(waiting, paused_for_none)).order_by(runs.c.updated_at).limit(limit)
    )
    return [r.run_id for r in rows]
