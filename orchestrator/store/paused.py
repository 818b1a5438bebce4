"""The store's side of a person in the loop (`Store.requirements`): runs paused with what they
ask, and decisions stored one by one.

- `pause`: a tool step's commit that moves its run to PAUSED (its other calls' results with it),
  the run's WAITING teams up to the top moved to PAUSED too, and one `ratchet_requirements` row
  per paused call, in one transaction fenced by the step's claim.
- `decide`: one decision, stored once (the same decision again is a no-op; another one is
  refused, naming who decided first); when it is the last pending requirement of its run, the
  run moves PAUSED -> QUEUED in the same transaction, and each team above it whose tree has no
  pending requirement left moves PAUSED -> WAITING (`release`; a fan-in uses it too, for a team
  whose paused member was cancelled or failed). Only a PAUSED run's pending requirements count
  (`waiting_below`): those of a run cancelled or failed wait for nobody.
- `pause_for_budget`: a model step's claim that moves its run to PAUSED before its call, with the
  budget it spent (`orchestrator.budgets`), its teams above it PAUSED too; `spending`, what that
  check reads (`store/spend.py`).

Every write that moves more than one run of a tree first locks the row of the tree's top run
(its root: `lock`, `lock_root`): a pause, a decision and a fan-in (`store/teams.py`). So two
deciders of one team, or a decision, a member's pause and a member's fan-in, take turns: exactly
one of them sees that nothing is pending any more, and on PostgreSQL none holds a row of the
tree another one waits for (no deadlock).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, func, insert, select, update
from sqlalchemy.engine import Row

from orchestrator.budgets import Scope, Spending
from orchestrator.errors import (
    DecisionConflictError,
    DecisionExpiredError,
    FencedError,
    RequirementNotFoundError,
    RunNotFoundError,
    RunNotPausedError,
)
from orchestrator.messages import Message
from orchestrator.requirements import DEADLINE, Decision, RunRequirement, check, needs_the_tool
from orchestrator.run import RunRecord
from orchestrator.state import StateChange
from orchestrator.status import RunStatus
from orchestrator.store import reads, spend, writes
from orchestrator.store.backend import Backend
from orchestrator.store.catalog_rows import newest_live
from orchestrator.store.claims import Claim, held
from orchestrator.store.deciding import Decided, at_once
from orchestrator.store.requirement_rows import Door, PausedCall, from_row, of_run, paused_call
from orchestrator.store.tables import requirements, runs
from orchestrator.store.trees import ancestors, lock, lock_run, wake_teams

if TYPE_CHECKING:
    from orchestrator.store.store import Store

S = RunStatus


@dataclass(frozen=True, kw_only=True)
class Asked:
    """A requirement a pausing step writes: a paused call (or a spent budget) and its deadline."""

    pause_type: str
    tool_call_id: str | None = None
    tool_name: str | None = None
    tool_args: dict[str, Any] | None = None
    #: The user-input fields asked ({"fields": [...]}) or the budget spent ({"budget": {...}}).
    detail: dict[str, Any] | None = None
    deadline_at: float | None = None
    on_timeout: str | None = None
    #: The paused tool as it paused: the pausing worker's definition hash, the tool's digest
    #: (`orchestrator.paused_tools`).
    definition_hash: str | None = None
    tool_digest: str | None = None


class Requirements:
    """The writes and reads of requirements, on the store's guarded moves."""

    def __init__(self, store: Store, backend: Backend) -> None:
        self._store = store
        self._backend = backend

    # ---------------------------------------------------------------- pausing

    def pause(
        self,
        claim: Claim,
        new_messages: Sequence[Message],
        asked: Sequence[Asked],
        *,
        publish_grace: float,
        state_changes: Sequence[StateChange] = (),
    ) -> RunRecord:
        """Commit the step's messages and move its run to PAUSED with `asked`, its teams above it
        PAUSED too (those WAITING), in one transaction fenced by the claim (FencedError if lost)."""
        store = self._store
        with store.engine.begin() as conn:
            chain = ancestors(conn, claim.record)
            root = chain[-1].run_id if chain else claim.run_id
            lock(conn, root)
            committed = store.commit_step(
                claim,
                new_messages,
                status=S.PAUSED,
                next_step="tools",
                publish_grace=publish_grace,
                state_changes=state_changes,
                conn=conn,
            )
            now = store.clock()
            # A microsecond apart, in the batch's order: read back (oldest first) in call order.
            ids = [self._insert(conn, committed, root, item, now + i * 1e-6) for i, item in enumerate(asked)]
            store.log_event(conn, claim.run_id, "paused", committed.seq, requirements=ids, **writes.position(committed))
            for team in chain:
                store.move(team.run_id, src=(S.WAITING,), dst=S.PAUSED, event="paused", conn=conn)
        store.remember(committed, new_messages)
        return committed

    def pause_for_budget(self, claim: Claim, asked: Asked) -> RunRecord:
        """Move the claimed run RUNNING -> PAUSED before its model call (its next step stays
        "model"), lease released, with `asked`: the budget it spent; its teams above it WAITING
        move to PAUSED too. One transaction fenced by the claim (FencedError if lost). The claim
        does not count as an attempt of the step: a run paused and raised any number of times is
        no poison step."""
        store = self._store
        with store.engine.begin() as conn:
            chain = ancestors(conn, claim.record)
            root = chain[-1].run_id if chain else claim.run_id
            lock(conn, root)
            now = store.clock()
            paused = store.move(
                claim.run_id,
                src=(S.RUNNING,),
                dst=S.PAUSED,
                epoch=claim.epoch,
                extra_where=held(claim, now),
                conn=conn,
                lease_owner=None,
                lease_expires_at=None,
                attempts=runs.c.attempts - 1,
            )
            if paused is None:
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before its budget paused it")
            ids = [self._insert(conn, paused, root, asked, now)]
            store.log_event(conn, claim.run_id, "paused", paused.seq, requirements=ids, **writes.position(paused))
            for team in chain:
                store.move(team.run_id, src=(S.WAITING,), dst=S.PAUSED, event="paused", conn=conn)
        return paused

    def _insert(self, conn: Connection, run: RunRecord, root: str, item: Asked, now: float) -> str:
        requirement_id = str(uuid.uuid4())
        conn.execute(
            insert(requirements).values(
                id=requirement_id,
                run_id=run.run_id,
                root_run_id=root,
                agent_name=run.agent_name,
                seq=run.seq,
                pause_type=item.pause_type,
                tool_call_id=item.tool_call_id,
                tool_name=item.tool_name,
                tool_args=json.dumps(item.tool_args) if item.tool_args is not None else None,
                detail=json.dumps(item.detail) if item.detail is not None else None,
                created_at=now,
                deadline_at=item.deadline_at,
                on_timeout=item.on_timeout,
                status="pending",
                definition_hash=item.definition_hash,
                tool_digest=item.tool_digest,
            )
        )
        return requirement_id

    # ---------------------------------------------------------------- deciding

    def decide(
        self,
        run_id: str,
        requirement_id: str,
        decision: Decision,
        *,
        by: str | None,
        publish_grace: float,
        at_deadline: bool = False,
        door: Door | None = None,
    ) -> Decided:
        """Store one decision on a requirement of the run `run_id` (or of one of its member runs).

        RequirementNotFoundError for an id the run has not; DecisionConflictError if it was
        decided another way (the first stands); DecisionExpiredError past its deadline or the
        run's (or its team's; read from the rows: a restart changes nothing); RunNotPausedError
        for a run that is not PAUSED (or in a cancelled team); DecisionKindError for a decision
        that does not answer it. The same decision again returns `already=True` and changes
        nothing. The run's row is locked after the root's: a cancel of it waits for the decision,
        or the decision for the cancel. `at_deadline`: the deadline's own decision
        (`orchestrator.deadlines`), taken past it. `door`: the producer's check of a decision that
        needs the paused tool against the newest live definition of its agent in the catalog, read
        here, in the decision's transaction (PausedToolChangedError from `orchestrator.paused_tools`).

        The common case is stored at once (`store/deciding.py`: on PostgreSQL one statement);
        every other one, or one that case turns out not to be, takes the general path here."""
        store = self._store
        checking = door if door is not None and needs_the_tool(decision) else None  # a rejection stands
        if not at_deadline:
            now = store.clock()
            since = None if checking is None else now - checking.window
            done = at_once(
                self._backend,
                run_id,
                requirement_id,
                decision,
                by=by,
                now=now,
                publish_grace=publish_grace,
                since=since,
            )
            if done is not None:
                return done
        with store.engine.begin() as conn:
            locked, run = _locked(conn, run_id, requirement_id)
            requirement = from_row(locked)
            earlier = self._earlier(requirement, decision)
            if earlier is not None:
                return earlier
            now = store.clock()
            teams = ancestors(conn, run) if run.parent_run_id is not None else []
            self._check_open(requirement, run, teams, now, at_deadline=at_deadline)
            check(requirement, decision)
            if checking is not None:
                checking(paused_call(locked), newest_live(conn, locked.agent_name, now - checking.window))
            if at_deadline:
                by = DEADLINE
                log_deadline(store, conn, run, requirement)
            decided = self._store_decision(conn, run, requirement_id, decision, by, now)
            return self._resume(conn, run, locked.root_run_id, decided, publish_grace)

    def _store_decision(
        self, conn: Connection, run: RunRecord, requirement_id: str, decision: Decision, by: str | None, now: float
    ) -> RunRequirement:
        """Write the decision on its pending row and log it; the requirement as decided."""
        row = conn.execute(
            update(requirements)
            .where(requirements.c.id == requirement_id, requirements.c.status == "pending")
            .values(
                status="decided",
                decision=json.dumps(decision.to_json()),
                decided_by=(by or "")[:128] or None,
                decided_at=now,
            )
            .returning(*requirements.c)
        ).one()
        self._store.log_event(
            conn,
            run.run_id,
            "decision",
            run.seq,
            requirement=requirement_id,
            by=by,
            decision=decision.describe(),
            **writes.position(run),
        )
        return from_row(row)

    def _earlier(self, requirement: RunRequirement, decision: Decision) -> Decided | None:
        """The answer for a requirement decided already: the same decision is a no-op."""
        if requirement.status != "decided":
            return None
        if requirement.decision == decision:
            return Decided(requirement=requirement, already=True)
        when = requirement.decided_at or 0.0
        first = requirement.decision.describe() if requirement.decision else "?"
        raise DecisionConflictError(
            f"requirement {requirement.id} was decided already ({first}) "
            f"by {requirement.decided_by or 'an unnamed decider'} at {when:.3f}; the first decision stands",
            decided_by=requirement.decided_by,
            decided_at=requirement.decided_at,
        )

    def _check_open(
        self, requirement: RunRequirement, run: RunRecord, teams: list[RunRecord], now: float, *, at_deadline: bool
    ) -> None:
        """Refuse a decision on a requirement whose deadline passed (but the deadline's own), of a
        PAUSED run past its own deadline or its team's (`run_timeout`: the sweep, which stops it
        before it acts on any pause's deadline, has not come yet; the deadline's own decision is
        refused too), of a run that is not PAUSED, or of a member whose team (`teams`: those above
        it) was cancelled: the cancel reached the team and not yet the member, each in a
        transaction of its own."""
        passed = requirement.deadline_at is not None and now >= requirement.deadline_at
        if requirement.status == "expired" and not passed:  # another deadline ended its run
            raise DecisionExpiredError(
                f"requirement {requirement.id} expired: a deadline ended run {run.run_id} (another call's "
                "pause_timeout with on_timeout 'error', or the run's own run_timeout); continue the run to be "
                "asked again"
            )
        if requirement.status == "expired":
            raise _policy_decides(requirement)
        cancelled = [team.run_id for team in teams if team.status == S.CANCELLED]
        is_open = run.status == S.PAUSED and requirement.status == "pending" and not cancelled
        late = next((r for r in (run, *teams) if r.deadline_at is not None and now >= r.deadline_at), None)
        if late is not None and is_open:
            raise DecisionExpiredError(
                f"run {late.run_id} passed its deadline (its run_timeout) at {late.deadline_at:.3f}: requirement "
                f"{requirement.id} is not decided, and the run stops in ERROR at the next sweep; continue it "
                "then to be asked again"
            )
        if passed and not at_deadline:
            raise _policy_decides(requirement)
        if not is_open:
            where = f"in the cancelled team {cancelled[0]}" if cancelled else f"{run.status}, not PAUSED"
            raise RunNotPausedError(f"run {run.run_id} is {where}: requirement {requirement.id} cannot be decided now")

    def _resume(
        self, conn: Connection, run: RunRecord, root: str, decided: RunRequirement, publish_grace: float
    ) -> Decided:
        """After a decision: queue the run again if nothing of it is pending, and move each team
        above it back to WAITING whose tree has nothing pending either."""
        if _pending_count(conn, requirements.c.run_id == run.run_id):
            return Decided(requirement=decided)
        store = self._store
        resumed = store.move(
            run.run_id,
            src=(S.PAUSED,),
            dst=S.QUEUED,
            epoch=run.epoch,
            bump_epoch=True,
            event="resume",
            publish_grace=publish_grace,
            conn=conn,
        )
        teams = wake_teams(conn, store, run, root) if run.parent_run_id is not None else []
        return Decided(requirement=decided, resumed=resumed, teams=tuple(teams))

    # ---------------------------------------------------------------- reads

    def decided(self, run_id: str, call_ids: Sequence[str]) -> dict[str, PausedCall]:
        """The decided requirements of these calls of the run, by call id (the latest of each),
        with what each keeps of its tool as it paused."""
        query = (
            select(requirements)
            .where(
                requirements.c.run_id == run_id,
                requirements.c.status == "decided",
                requirements.c.tool_call_id.in_(list(call_ids)),
            )
            .order_by(requirements.c.created_at)
        )
        rows = self._backend.quick(lambda c: list(c.execute(query)))
        return {row.tool_call_id: paused_call(row) for row in rows}

    def spending(self, record: RunRecord, scopes: Collection[Scope]) -> Spending:
        """What a budget check of the run reads (`store/spend.py`): the spend of each scope, and
        the run's decided budget raises, in one snapshot."""
        return self._backend.snapshot(lambda c: spend.read(c, record, scopes))

    def of_run(self, run_id: str) -> list[RunRequirement]:
        """Every requirement of the run, oldest first (its members' not included)."""
        return self._backend.quick(lambda c: of_run(c, run_id))

    def pending(
        self, *, agent_name: str | None = None, user_id: str | None = None, limit: int = 100
    ) -> list[RunRequirement]:
        """Requirements waiting for a person across runs, oldest first: pending, their run PAUSED,
        not in a cancelled tree (a cancel cut short before it reached them: no decision is taken)."""
        top = runs.alias("top")
        where = [requirements.c.status == "pending", runs.c.status == S.PAUSED.value, top.c.status != S.CANCELLED.value]
        if agent_name is not None:
            where.append(requirements.c.agent_name == agent_name)
        if user_id is not None:
            where.append(runs.c.user_id == user_id)
        query = (
            select(requirements)
            .join(runs, runs.c.run_id == requirements.c.run_id)
            .join(top, top.c.run_id == requirements.c.root_run_id)
            .where(*where)
            .order_by(requirements.c.created_at, requirements.c.id)
            .limit(limit)
        )
        return self._backend.quick(lambda c: [from_row(row) for row in c.execute(query)])

    def due(self, now: float, *, limit: int = 100) -> list[RunRequirement]:
        """Pending requirements whose deadline passed, of runs still PAUSED and not in a cancelled
        tree (a cancel cut short before it reached them): the sweeper's."""
        top = runs.alias("top")
        query = (
            select(requirements)
            .join(runs, runs.c.run_id == requirements.c.run_id)
            .join(top, top.c.run_id == requirements.c.root_run_id)
            .where(
                requirements.c.status == "pending",
                requirements.c.deadline_at <= now,
                runs.c.status == S.PAUSED.value,
                top.c.status != S.CANCELLED.value,
            )
            .order_by(requirements.c.deadline_at)
            .limit(limit)
        )
        return self._backend.quick(lambda c: [from_row(row) for row in c.execute(query)])


# -------------------------------------------------------------------- functions of a connection


def _policy_decides(requirement: RunRequirement) -> DecisionExpiredError:
    """The refusal of a decision that came after its requirement's own deadline."""
    return DecisionExpiredError(
        f"requirement {requirement.id}'s deadline passed at {requirement.deadline_at or 0:.3f}; "
        f"its on_timeout policy ({requirement.on_timeout or 'reject'}) decides it, not this decision"
    )


def log_deadline(store: Store, conn: Connection, run: RunRecord, requirement: RunRequirement) -> None:
    """Log why the deadline acted on the run: event "deadline", with the requirement, its policy
    and when its deadline was."""
    store.log_event(
        conn,
        run.run_id,
        "deadline",
        run.seq,
        requirement=requirement.id,
        policy=requirement.on_timeout or "reject",
        deadline_at=requirement.deadline_at,
        **writes.position(run),
    )


def _locked(conn: Connection, run_id: str, requirement_id: str) -> tuple[Row[Any], RunRecord]:
    """The requirement's row and its run's, the run's row locked after its root's (a cancel of it
    takes turns with the decision), the requirement read again as any decider before left it;
    RequirementNotFoundError for one the run `run_id` (or one of its member runs) has not."""
    row = row_of(conn, requirement_id)
    if row is None or not _belongs(conn, row, run_id):
        raise RequirementNotFoundError(
            f"run {run_id} has no requirement {requirement_id!r}; its requirements are listed with the run "
            f"(`ratchet pending`, GET /runs/{run_id})"
        )
    if row.root_run_id != row.run_id and not lock(conn, row.root_run_id):
        raise RunNotFoundError(f"no run with run_id {row.root_run_id!r} in this database")
    run = lock_run(conn, row.run_id)
    if run is None:
        raise RunNotFoundError(f"no run with run_id {row.run_id!r} in this database")
    locked = row_of(conn, requirement_id)
    assert locked is not None
    return locked, run


def row_of(conn: Connection, requirement_id: str) -> Row[Any] | None:
    """A requirement's row, or None."""
    return conn.execute(select(requirements).where(requirements.c.id == requirement_id)).first()


def _belongs(conn: Connection, row: Row[Any], run_id: str) -> bool:
    """Whether the requirement is the run's own or one of its member runs' (at any depth)."""
    if row.run_id == run_id:
        return True
    record = reads.find_record(conn, row.run_id)
    return record is not None and any(team.run_id == run_id for team in ancestors(conn, record))


def _pending_count(conn: Connection, *where: Any) -> int:
    query = select(func.count()).select_from(requirements).where(requirements.c.status == "pending", *where)
    return int(conn.execute(query).scalar_one())
