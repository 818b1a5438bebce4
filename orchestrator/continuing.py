"""Continuing a run: resume it in place, fork it, or continue a team through its failed members.

`RunControl.continue_run` checks its arguments and tries `Continuation.resume` on the run as it
reads it, until one try answers. What a try decides, by the run's status:

- CANCELLED: refused, a cancelled run is final.
- COMPLETED: forked (`fork`): a new run with its transcript and the input, in its session. The
  fork's id is a function of the request (`derived_run_id`), so a double-clicked or redelivered
  continue finds the fork the first one made.
- QUEUED, WAITING and RUNNING under a live lease: going already; input is refused (it would be
  dropped), a continue without input returns the run.
- PAUSED: waiting for decisions, which queue it again themselves (`store/paused.py`); a
  continue without input returns it, one with input is refused until it is decided.
- ERROR and RUNNING past its lease: moved to QUEUED, guarded by its epoch, and its step
  published. A team in ERROR because a member failed continues that member in place first, then
  waits on it again (`continue_team`).

Deadlines (`orchestrator.deadlines`): the run a continue moves on keeps its deadline while it is
ahead; the continue's `run_timeout` gives it a new one from now; a deadline that passed (a run
stopped by RunTimeoutError, or one that failed before and is continued late) is given again from
now, the run's own `run_timeout` long, so the continue is not undone by the next sweep. A fork
gets the continue's `run_timeout`, else its source's, from now. A continue that leaves the run as
it is (going, PAUSED) refuses a `run_timeout` as it refuses input: RunBusyError.

A guarded move that matches nothing means the run moved since it was read (another continue, a
cancel, its worker, a prune): the try answers None and the caller reads the run again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError

from orchestrator import tracing
from orchestrator.delegation import fan_in_now, wake_step
from orchestrator.errors import (
    BrokerUnavailableError,
    RunBusyError,
    RunConflictError,
    RunNotContinuableError,
    RunNotFoundError,
    SessionOwnedError,
)
from orchestrator.messages import Message, ToolCall, unanswered_calls
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Store

S = RunStatus
#: The namespace of the run ids Ratchet derives. Fixed for good: a new one would make a request
#: repeated across an upgrade start a second run.
_DERIVED_IDS = uuid.UUID("9b3c1e52-6f0a-4d8e-a5b7-2c4e8f1d3a60")


def derived_run_id(*parts: str) -> str:
    """A run id that is a function of `parts` (uuid5): the same request finds the same run.

    The fork of a run (`"fork", run_id, "key" | "input", text`) and the run of a `ratchet.start_run`
    task sent without a run id (`"celery-task", task_id`) get theirs this way."""
    return str(uuid.uuid5(_DERIVED_IDS, json.dumps(parts)))


class Continuation:
    """One continue's decisions over a store. `publish` publishes a QUEUED run's step (the run
    control's, which marks the run due when the broker refuses it); `continue_member` continues
    a team's failed member as a continue of its own; `definition_hash` is what a new run (a fork)
    of an agent records as its definition; `accepted`, the definitions a person accepted, by
    agent name, for the runs it moves on (`continue_run(accept_definition=...)`)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        publish: Callable[[RunRecord], None],
        continue_member: Callable[[str], str],
        definition_hash: Callable[[str], str | None],
        accepted: Mapping[str, str] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.publish = publish
        self.continue_member = continue_member
        self.definition_hash = definition_hash
        #: The definitions a person accepted for the runs this continue moves on, by agent name
        #: (`orchestrator.deploys`): recorded on each, for a worker of it to take the run over.
        self.accepted = dict(accepted or {})

    def resume(
        self,
        record: RunRecord,
        input: str | None,
        fork_key: str | None,
        *,
        raced: bool,
        run_timeout: float | None = None,
    ) -> str | None:
        """One try of a continue on the run as read: its answer, or None when the guarded move
        matched nothing. `raced`: an earlier try lost its move, so whatever the run is doing now
        another request, its worker or the sweeper started since this continue was sent.
        `run_timeout`: the new deadline of the run that goes on, in seconds from now (checked)."""
        if record.status == S.COMPLETED:
            # Resumed by someone else and finished since: without input there is nothing left to
            # do (a fork would ask the model again for nothing); the input goes to a fork, as any.
            if raced and input is None and run_timeout is None:
                return record.run_id
            return self.fork(record, input, fork_key, run_timeout)
        going = self._going(record, input, raced=raced)
        if going is not None and run_timeout is not None:
            raise RunBusyError(
                f"run {record.run_id} is {record.status}; a continue gives a new run_timeout only to a run it moves "
                "on (ERROR, COMPLETED), and this one goes on as it is: its deadline was not changed"
            )
        if going is not None and self.accepted:
            raise RunBusyError(
                f"run {record.run_id} is {record.status}; a continue accepts a definition only for a run it moves "
                "on (one in ERROR with DefinitionChangedError), and this one goes on as it is: nothing was accepted; "
                "continue it with accept_definition if it stops with that error"
            )
        if going is not None:
            return going
        return self._move_on(record, input, run_timeout)

    def _deadline(self, record: RunRecord, run_timeout: float | None) -> dict[str, Any]:
        """What a continue that moves `record` on writes of its deadline (see above)."""
        now = self.store.clock()
        if run_timeout is not None:
            return {"deadline_at": now + run_timeout, "run_timeout": run_timeout}
        if record.deadline_at is not None and record.deadline_at <= now and record.run_timeout is not None:
            return {"deadline_at": now + record.run_timeout}
        return {}

    def _going(self, record: RunRecord, input: str | None, *, raced: bool) -> str | None:
        """The answer for a run that is cancelled or going already (or a refusal); None for a run
        this continue is to move on."""
        run_id, status, now = record.run_id, record.status, self.store.clock()
        if status == S.CANCELLED:
            was = "was cancelled while this continue was on its way" if raced else "was cancelled"
            raise RunNotContinuableError(f"run {run_id} {was}; a cancelled run is final. Start a new run.")
        live = status == S.RUNNING and record.lease_live(now)
        if raced and (live or status in (S.QUEUED, S.WAITING)):
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
        if status == S.PAUSED:
            if input is not None:
                raise RunBusyError(
                    f"run {run_id} is PAUSED, waiting for decisions on its requirements; decide them "
                    "(`ratchet pending`, RunRequirement.confirm()/reject()/...) and send the input once it stops again"
                )
            return run_id
        if live:
            left = (record.lease_expires_at or now) - now
            raise RunBusyError(
                f"run {run_id} is RUNNING on {record.lease_owner} and its lease is live for another {left:.0f}s "
                "(RATCHET_LEASE_SECONDS); wait for it, or continue it after the lease expires"
            )
        return None

    def _move_on(self, record: RunRecord, input: str | None, run_timeout: float | None) -> str | None:
        """Move a stopped run (ERROR, RUNNING past its lease) back to QUEUED and publish
        its step: the tool calls it still owes first, else a model call with the new input."""
        run_id, status = record.run_id, record.status
        owed = unanswered_calls(self.store.get_messages(run_id))
        if owed and input is not None:
            raise RunBusyError(
                f"run {run_id} still owes results for tool calls {[c.id for c in owed]}; "
                "continue it without input first"
            )
        # A team that failed because a member did: continue the member in place, then the leader.
        members = self._owed_members(record, owed) if owed and status == S.ERROR else []
        if members:
            return run_id if self.continue_team(record, members, run_timeout) else None
        moved = self.store.move(
            run_id,
            src=(status,),
            dst=S.QUEUED,
            epoch=record.epoch,
            bump_epoch=True,
            event="continue",
            new_messages=[Message(role="user", content=input)] if input is not None else [],
            seq=record.seq + 1,
            next_step="tools" if owed else "model",
            attempts=0,
            retries=0,
            model_index=None,
            lease_owner=None,
            lease_expires_at=None,
            error_type=None,
            error_message=None,
            publish_grace=self.settings.publish_grace_seconds,
            **_next_stretch(record, self.store.clock()),
            **self._deadline(record, run_timeout),
            **self._accepting(record),
        )
        if moved is None:
            return None
        self.publish(moved)
        return run_id

    def _accepting(self, record: RunRecord) -> dict[str, Any]:
        """What a move of `record` writes of the definition a person accepted for it, if any."""
        accepted = self.accepted.get(record.agent_name)
        return {"accepted_definition": accepted} if accepted is not None else {}

    # ---------------------------------------------------------------- fork

    def fork(self, record: RunRecord, input: str | None, key: str | None, run_timeout: float | None = None) -> str:
        """A new run with the COMPLETED run's transcript (and `input`), in its session, for its
        user; its deadline `run_timeout` from now, else its source's `run_timeout` (if any)."""
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
            timeout = run_timeout if run_timeout is not None else record.run_timeout
            created = self._create_fork(record, fork_id, messages, timeout)
        except IntegrityError as exc:  # a concurrent continue made it first
            try:
                return self._same_fork(record, self.store.get_record(fork_id))
            except RunNotFoundError:
                raise exc from None
        except SessionOwnedError:  # only a run written before a session took one user's runs
            raise SessionOwnedError(
                f"run {record.run_id} is in a session that belongs to another user, so it cannot be forked there; "
                "start a new run (in a new session) with what it needs instead"
            ) from None
        self.publish(created)
        return fork_id

    def _create_fork(
        self, record: RunRecord, fork_id: str, messages: Sequence[Message], run_timeout: float | None
    ) -> RunRecord:
        with tracing.starting(record.agent_name, fork_id, source=record) as trace_context:
            return self.store.create_run(
                run_id=fork_id,
                session_id=record.session_id,
                agent_name=record.agent_name,
                kind=record.kind,
                input_messages=[m.model_copy(update={"created_at": None}) for m in messages],
                publish_grace=self.settings.publish_grace_seconds,
                # A fork of a member's run is the user's own run, not a member of the team any more.
                parent_run_id=None,
                forked_from=record.run_id,
                system_message=record.system_message,
                stream=record.stream,
                # The fork has the source's history, not the source itself again (it copies its messages).
                history=record.history if record.history is not None else "[]",
                user_id=record.user_id,
                priority=record.priority,
                trace_context=trace_context,
                definition_hash=self.definition_hash(record.agent_name),
                webhook=record.webhook,  # the fork is told of its stops as its source was
                run_timeout=run_timeout,
            )

    @staticmethod
    def _same_fork(source: RunRecord, fork: RunRecord) -> str:
        if fork.forked_from != source.run_id:  # only a producer that chose this very id gets here
            raise RunConflictError(f"run_id {fork.run_id!r}, the id of this fork, is taken by another run")
        return fork.run_id

    # ---------------------------------------------------------------- a team through its members

    def _owed_members(self, team: RunRecord, owed: Sequence[ToolCall]) -> list[RunRecord]:
        """The member runs the team's unanswered calls started (none: the tool step failed
        before delegating, and the team's tool step is continued as usual)."""
        owed_ids = {c.id for c in owed}
        return [c for c in self.store.children(team.run_id) if c.parent_tool_call_id in owed_ids]

    def continue_team(self, team: RunRecord, members: Sequence[RunRecord], run_timeout: float | None = None) -> bool:
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
                    self.continue_member(member.run_id)
                except BrokerUnavailableError as exc:  # saved as QUEUED; the sweeper publishes it
                    broker_down = exc
                except RunNotFoundError:  # deleted with its team (a prune): the team's move finds it gone
                    pass
        moved = self.store.move(
            team.run_id,
            src=(S.ERROR,),
            dst=S.WAITING,
            epoch=team.epoch,
            bump_epoch=True,
            event="continue",
            next_step=None,
            attempts=0,
            retries=0,
            model_index=None,
            lease_owner=None,
            lease_expires_at=None,
            error_type=None,
            error_message=None,
            **_next_stretch(team, self.store.clock()),
            **self._deadline(team, run_timeout),
            **self._accepting(team),
        )
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


def _next_stretch(record: RunRecord, now: float) -> dict[str, Any]:
    """A run continued after ERROR starts a new stretch of its trace (`tracing.resumed`): the
    ERROR ended its span; a RUNNING run whose lease expired stays in the stretch it was in."""
    return {"trace_context": tracing.resumed(record, now)} if record.status == S.ERROR else {}
