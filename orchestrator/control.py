"""Run control: start, continue, fork and cancel runs of agents and teams.

Every producer goes through here: `Client` (and so `Agent.run` and friends, and the CLI) and the
Celery tasks `ratchet.start_run` and `ratchet.continue_run`. `RunControl` works on the store
and publishes through the dispatcher port; it never calls a producer back. What a producer does
to a team is here too: continuing a team that failed because a member did continues that member
first, cancelling a team cancels its members, and a member cancelled on its own hands its team
a tool error. What a step does to a team (start its members, fan their answers in) is
`orchestrator.delegation`, which works on the store alone.

Every write is a guarded move (`Store.move`: from these statuses, at this epoch), so two
producers racing on one run publish one step. A step the broker refuses is not lost: the run is
marked due, the sweeper publishes it, and the producer gets BrokerUnavailableError naming it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError

from orchestrator import agent as registry
from orchestrator import flow, tracing, validation
from orchestrator.delegation import fan_in_now, wake_step
from orchestrator.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    RatchetError,
    RunBusyError,
    RunConflictError,
    RunNotContinuableError,
    RunNotFoundError,
    SessionOwnedError,
)
from orchestrator.idempotency import StartRequest
from orchestrator.messages import Message, ToolCall, unanswered_calls
from orchestrator.ports import Dispatcher, Limiter
from orchestrator.routing import owed, step_of
from orchestrator.run import RunOutput, RunRecord
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Store

log = logging.getLogger("ratchet.control")
S = RunStatus
#: Where a cancel applies (COMPLETED and CANCELLED are final).
CANCELLABLE = (S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED, S.ERROR)
#: The namespace of the run ids Ratchet derives. Fixed for good: a new one would make a request
#: repeated across an upgrade start a second run.
_DERIVED_IDS = uuid.UUID("9b3c1e52-6f0a-4d8e-a5b7-2c4e8f1d3a60")
#: Tries of one continue whose guarded move keeps matching nothing: each lost try means another
#: writer moved the run in between, so this bounds a continue that keeps losing, not a wait.
_TRIES = 5


def derived_run_id(*parts: str) -> str:
    """A run id that is a function of `parts` (uuid5): the same request finds the same run.

    The fork of a run (`"fork", run_id, "key" | "input", text`) and the run of a `ratchet.start_run`
    task sent without a run id (`"celery-task", task_id`) get theirs this way."""
    return str(uuid.uuid5(_DERIVED_IDS, json.dumps(parts)))


class RunControl:
    """Start, continue, fork and cancel runs, over a store and a dispatcher.

    Each method checks its arguments (`orchestrator.validation`) before it writes anything and
    returns the id of the run it acted on; `Client` wraps that in a handle."""

    def __init__(
        self, store: Store, settings: Settings, dispatcher: Dispatcher, *, limiter: Limiter | None = None
    ) -> None:
        self.store = store
        self.settings = settings
        self.dispatcher = dispatcher
        #: Where a cancelled run frees its place among its key's runs: needed with
        #: RATCHET_MAX_RUNS_PER_KEY only (a runtime's, `Client.control`).
        self.limiter = limiter

    def _limiter(self) -> Limiter:
        if self.limiter is None:
            raise ConfigurationError("RATCHET_MAX_RUNS_PER_KEY is set, and this RunControl was given no limiter")
        return self.limiter

    # ---------------------------------------------------------------- start

    def start(
        self,
        agent: str,
        *,
        input: str,
        session_id: str | None = None,
        run_id: str | None = None,
        stream: bool = False,
        user_id: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
    ) -> str:
        """Write the run and its user message (QUEUED), publish its first step; return its id.
        `stream`: its model steps publish their text deltas as live events (`Client.stream`).
        `user_id`: who the run is for. A session is its first run's user's (None included): a run
        for another user in it is SessionOwnedError, and nothing is written, checked in the
        statement or transaction that writes the run, so of two first runs racing for one
        session one user's is written. `session_state`: merged over the session's stored state,
        key by key, when the run is written (`orchestrator.state`). `priority`: 0-9, higher first
        (None: none, as 0); every step of the run is published with it.

        A run_id that exists, for the same request (`orchestrator.idempotency`: user, agent, input,
        stream, priority, session_state, and the session if given), is the same start
        again (a retry, a redelivery): its id is returned, nothing is published and the state is
        not merged again. For another request it is RunConflictError."""
        request = StartRequest.checked(
            agent=agent,
            input=input,
            session_id=session_id,
            user_id=user_id,
            stream=stream,
            priority=priority,
            session_state=session_state,
        )
        agent, given_session, user_id, state = request.agent, request.session_id, request.user_id, request.session_state
        run_id = str(uuid.uuid4()) if run_id is None else validation.run_id(run_id)
        try:
            kind = registry.get_agent(agent).kind
        except RatchetError:
            kind = "agent"  # a producer need not import the agents; the worker knows them
        try:
            with tracing.starting(agent, run_id) as trace_context:
                record = self.store.create_run(
                    run_id=run_id, session_id=given_session or str(uuid.uuid4()), agent_name=agent, kind=kind,
                    input_messages=[Message(role="user", content=request.input)],
                    publish_grace=self.settings.publish_grace_seconds, stream=request.stream, user_id=user_id,
                    session_state=state, priority=request.priority, trace_context=trace_context,
                    request_digest=request.digest,
                )  # fmt: skip
        except IntegrityError as exc:
            existing = self._existing(run_id, exc)
            conflict = request.conflict(existing, lambda: self._first_input(run_id))
            if conflict is not None:
                raise RunConflictError(conflict) from None
            return run_id
        self.publish(record)
        return run_id

    def _first_input(self, run_id: str) -> str | None:
        """The user message a run was started with."""
        return next((m.content for m in self.store.get_messages(run_id) if m.role == "user"), None)

    def _existing(self, run_id: str, conflict: IntegrityError) -> RunRecord:
        """The run whose id made an insert fail (the insert's own error if there is none)."""
        try:
            return self.store.get_record(run_id)
        except RunNotFoundError:
            raise conflict from None

    def publish(self, record: RunRecord) -> None:
        """Publish the step a QUEUED run is due for. If the broker refuses it, mark the run due at
        once, so the first sweep after the broker is back publishes it, and raise
        BrokerUnavailableError naming the run: nothing is lost."""
        step = step_of(record, calls=owed(self.store, record.run_id))
        try:
            self.dispatcher.publish(step)
        except Exception as exc:
            self.store.mark_due(record.run_id, epoch=record.epoch)
            raise BrokerUnavailableError(
                f"run {record.run_id} is saved as QUEUED but its step could not be published ({type(exc).__name__}: "
                f"{exc}); nothing is lost: the sweeper (`ratchet sweep` or the beat task) publishes it once the broker "
                "is reachable",
                run_id=record.run_id,
            ) from exc

    # ---------------------------------------------------------------- continue and fork

    def continue_run(self, run_id: str, *, input: str | None = None, fork_key: str | None = None) -> str:
        """Resume a run and return the id of the run that goes on: ERROR/PAUSED and expired
        RUNNING resume in place; COMPLETED forks; QUEUED and WAITING are going already (no-op);
        CANCELLED is refused. The move out of the run's status is guarded by its epoch, so two
        concurrent continues publish one step.

        A continue answers only for a move it made or found made. When its guarded move matches
        nothing, the run moved since it was read (another continue, a cancel, its worker, a
        prune), and it decides again on the run as it is then (`_resume`): a run deleted
        meanwhile is RunNotFoundError, a cancelled one RunNotContinuableError, and a run that
        another request resumed gets that request's answer (its run_id) unless this continue
        carries input, which would be dropped: RunBusyError, nothing added."""
        run_id = validation.known_run_id(run_id)
        if input is not None:
            input = validation.input_text(input)
        if fork_key is not None:
            fork_key = validation.fork_key(fork_key)
        raced = False
        for _ in range(_TRIES):
            answer = self._resume(self.store.get_record(run_id), input, fork_key, raced=raced)
            if answer is not None:
                return answer
            raced = True
        raise RunBusyError(
            f"run {run_id} changed {_TRIES} times while this continue tried to resume it; nothing was added: "
            "continue it again"
        )

    def _resume(self, record: RunRecord, input: str | None, fork_key: str | None, *, raced: bool) -> str | None:
        """One try of `continue_run` on the run as read: its answer, or None when the guarded move
        matched nothing. `raced`: an earlier try lost its move, so whatever the run is doing now
        another request, its worker or the sweeper started since this continue was sent."""
        run_id, status, now = record.run_id, record.status, self.store.clock()
        if status == S.CANCELLED:
            was = "was cancelled while this continue was on its way" if raced else "was cancelled"
            raise RunNotContinuableError(f"run {run_id} {was}; a cancelled run is final. Start a new run.")
        if status == S.COMPLETED:
            # Resumed by someone else and finished since: without input there is nothing left to
            # do (a fork would ask the model again for nothing); the input goes to a fork, as any.
            return run_id if raced and input is None else self._fork(record, input, fork_key)
        going = status in (S.QUEUED, S.WAITING) or (status == S.RUNNING and record.lease_live(now))
        if going and raced:
            if input is not None:
                raise RunBusyError(
                    f"run {run_id} was resumed while this continue was on its way (it is {status} now); "
                    "its input was not added: send it again once the run stops"
                )
            return run_id
        if status in (S.QUEUED, S.WAITING):
            if input is not None:
                raise RunBusyError(f"run {run_id} is {status}; it cannot take new input until it stops")
            return run_id
        if status == S.RUNNING and record.lease_live(now):
            left = (record.lease_expires_at or now) - now
            raise RunBusyError(
                f"run {run_id} is RUNNING on {record.lease_owner} and its lease is live for another {left:.0f}s "
                "(RATCHET_LEASE_SECONDS); wait for it, or continue it after the lease expires"
            )
        messages = self.store.get_messages(run_id)
        owed = unanswered_calls(messages)
        if owed and input is not None:
            raise RunBusyError(
                f"run {run_id} still owes results for tool calls {[c.id for c in owed]}; "
                "continue it without input first"
            )
        # A team that failed because a member did: continue the member in place, then the leader.
        members = self._owed_members(record, owed) if owed and status == S.ERROR else []
        if members:
            return run_id if self._continue_team(record, members) else None
        new = [Message(role="user", content=input)] if input is not None else []
        moved = self.store.move(
            run_id, src=(status,), dst=S.QUEUED, epoch=record.epoch, bump_epoch=True, event="continue",
            new_messages=new, seq=record.seq + 1, next_step="tools" if owed else "model", attempts=0, retries=0,
            lease_owner=None, lease_expires_at=None, error_type=None, error_message=None,
            publish_grace=self.settings.publish_grace_seconds,
        )  # fmt: skip
        if moved is None:
            return None
        self.publish(moved)
        return run_id

    def _fork(self, record: RunRecord, input: str | None, key: str | None) -> str:
        """A new run with the COMPLETED run's transcript (and `input`), in its session, for its user."""
        # The fork's id is a function of the request, so a double-clicked or redelivered continue
        # finds the fork the first one made instead of making another.
        request = ("key", key) if key is not None else ("input", input or "")
        fork_id = derived_run_id("fork", record.run_id, *request)
        try:
            return self._same_fork(record, self.store.get_record(fork_id))
        except RunNotFoundError:
            pass
        messages = self.store.get_messages(record.run_id)
        if len(messages) < record.n_messages:  # read in one statement: all of them, or none once deleted
            raise RunNotFoundError(f"run {record.run_id} was deleted while this continue was forking it")
        if input is not None:
            messages.append(Message(role="user", content=input))
        try:
            with tracing.starting(record.agent_name, fork_id, source=record) as trace_context:
                created = self.store.create_run(
                    run_id=fork_id, session_id=record.session_id, agent_name=record.agent_name, kind=record.kind,
                    input_messages=[m.model_copy(update={"created_at": None}) for m in messages],
                    # A fork of a member's run is the user's own run, not a member of the team any more.
                    publish_grace=self.settings.publish_grace_seconds, parent_run_id=None,
                    forked_from=record.run_id, system_message=record.system_message, stream=record.stream,
                    # The fork has the source's history, not the source itself again (it copies its messages).
                    history=record.history if record.history is not None else "[]",
                    user_id=record.user_id, priority=record.priority, trace_context=trace_context,
                )  # fmt: skip
        except IntegrityError as exc:  # a concurrent continue made it first
            return self._same_fork(record, self._existing(fork_id, exc))
        except SessionOwnedError:  # only a run written before a session took one user's runs
            raise SessionOwnedError(
                f"run {record.run_id} is in a session that belongs to another user, so it cannot be forked there; "
                "start a new run (in a new session) with what it needs instead"
            ) from None
        self.publish(created)
        return fork_id

    @staticmethod
    def _same_fork(source: RunRecord, fork: RunRecord) -> str:
        if fork.forked_from != source.run_id:  # only a producer that chose this very id gets here
            raise RunConflictError(f"run_id {fork.run_id!r}, the id of this fork, is taken by another run")
        return fork.run_id

    def _owed_members(self, team: RunRecord, owed: Sequence[ToolCall]) -> list[RunRecord]:
        """The member runs the team's unanswered calls started (none: the tool step failed
        before delegating, and the team's tool step is continued as usual)."""
        owed_ids = {c.id for c in owed}
        return [c for c in self.store.children(team.run_id) if c.parent_tool_call_id in owed_ids]

    def _continue_team(self, team: RunRecord, members: Sequence[RunRecord]) -> bool:
        """Continue a team in ERROR that still waits on delegated members: continue the failed
        members in place (same run ids), move the team ERROR -> WAITING, and fan in at once in case
        every member has ended already. False when the team's move matched nothing (it moved
        since it was read): the caller decides again."""
        broker_down: BrokerUnavailableError | None = None
        # Members first: were the team WAITING with a member still in ERROR, a fan-in in between
        # (the sweeper's) would put the team straight back in ERROR.
        for member in members:
            if member.status == S.ERROR:
                try:
                    self.continue_run(member.run_id)
                except BrokerUnavailableError as exc:  # saved as QUEUED; the sweeper publishes it
                    broker_down = exc
                except RunNotFoundError:  # deleted with its team (a prune): the team's move finds it gone
                    pass
        moved = self.store.move(
            team.run_id, src=(S.ERROR,), dst=S.WAITING, epoch=team.epoch, bump_epoch=True, event="continue",
            next_step=None, attempts=0, retries=0, lease_owner=None, lease_expires_at=None,
            error_type=None, error_message=None,
        )  # fmt: skip
        if moved is not None:
            woken = fan_in_now(self.store, team.run_id, publish_grace=self.settings.publish_grace_seconds)
            if woken is not None and wake_step(woken) is not None:
                try:
                    self.publish(woken)
                except BrokerUnavailableError as exc:
                    broker_down = exc
        if broker_down is not None:
            raise broker_down
        return moved is not None

    # ---------------------------------------------------------------- cancel

    def cancel(self, run_id: str) -> RunOutput:
        """Cancel a run that has not finished, and its member runs; return the run as it ended.
        Its in-flight step is fenced by the epoch the move bumps. A CANCELLED run is a no-op; a
        COMPLETED one, RunNotContinuableError. Members that end meanwhile are left as they ended."""
        run_id = validation.known_run_id(run_id)
        record = self.store.get_record(run_id)
        if record.status == S.COMPLETED:
            raise RunNotContinuableError(f"run {run_id} is COMPLETED; there is nothing to cancel")
        if record.status == S.CANCELLED:
            return self.store.get_output(run_id)
        cancelled = self._cancel_one(run_id)
        if cancelled is None:
            # It ended between the read and the move: another cancel won, or it completed.
            if self.store.get_record(run_id).status == S.COMPLETED:
                raise RunNotContinuableError(f"run {run_id} completed before it could be cancelled")
            return self.store.get_output(run_id)
        self._release(cancelled)
        self._cancel_members(run_id)
        # A member cancelled on its own must not leave its team waiting forever.
        self._member_cancelled(record)
        return self.store.get_output(run_id)

    def _cancel_one(self, run_id: str) -> RunRecord | None:
        """Move one run to CANCELLED; None if it is COMPLETED or CANCELLED already."""
        return self.store.move(
            run_id, src=CANCELLABLE, dst=S.CANCELLED, bump_epoch=True, event="cancel",
            lease_owner=None, lease_expires_at=None, next_step=None,
        )  # fmt: skip

    def _release(self, record: RunRecord) -> None:
        """A cancelled run frees its place among its key's runs (`orchestrator.flow`) for the
        next run waiting, whose step is published here (or by the sweeper, if that fails)."""
        if self.settings.max_runs_per_key is None:
            return
        step = flow.release(self.settings, self._limiter, record)
        if step is not None:
            try:
                self.dispatcher.publish(step)
            except Exception as exc:
                log.warning(
                    "run %s: publishing the step of run %s failed (%s); the sweeper will",
                    record.run_id,
                    step.run_id,
                    exc,
                )

    def _cancel_members(self, run_id: str) -> None:
        """Cancel a cancelled team's member runs, and theirs. A member that completes or is
        cancelled meanwhile fails its move and is skipped, so the cascade always finishes; its
        team is cancelled already, so its fan-in changes nothing."""
        for child in self.store.children(run_id):
            if child.status not in (S.COMPLETED, S.CANCELLED) and self._cancel_one(child.run_id) is not None:
                self._cancel_members(child.run_id)

    def _member_cancelled(self, member: RunRecord) -> None:
        """A member run was cancelled on its own: its team gets a tool error for it and goes on.
        A publish that fails is only logged: the cancel happened, and the team's outbox marker
        lets the sweeper publish the leader's step."""
        if member.parent_run_id is None:
            return
        grace = self.settings.publish_grace_seconds
        step = wake_step(fan_in_now(self.store, member.parent_run_id, publish_grace=grace))
        if step is not None:
            try:
                self.dispatcher.publish(step)
            except Exception as exc:
                log.warning("run %s: publishing the leader's step failed (%s); the sweeper will", step.run_id, exc)
