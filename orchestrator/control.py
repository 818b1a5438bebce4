"""Run control: start, continue, fork and cancel runs of agents and teams.

Every producer goes through here: `Client` (and so `Agent.run` and friends, and the CLI) and the
Celery tasks `ratchet.start_run` and `ratchet.continue_run`. `RunControl` works on the store
and publishes through the dispatcher port; it never calls a producer back. What a continue
decides (resume in place, fork, continue a team through its failed members) is
`orchestrator.continuing`. What a producer does to a team is here too: cancelling a team
cancels its members, and a member cancelled on its own hands its team a tool error. What a step
does to a team (start its members, fan their answers in) is `orchestrator.delegation`, which
works on the store alone.

A run is written with its agent's kind and the hash of its definition, and its first step is
published to its agent's queue (`orchestrator.starting`, which a schedule's tick writes through too).

Every write is a guarded move (`Store.move`: from these statuses, at this epoch), so two
producers racing on one run publish one step. A step the broker refuses is not lost: the run is
marked due, the sweeper publishes it, and the producer gets BrokerUnavailableError naming it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from orchestrator import agent as registry
from orchestrator import catalog, limits, paused_tools, starting, validation, webhooks
from orchestrator.continuing import Continuation, derived_run_id
from orchestrator.delegation import fan_in_now, wake_step
from orchestrator.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    InvalidInputError,
    RunBusyError,
    RunNotContinuableError,
)
from orchestrator.idempotency import StartRequest
from orchestrator.ports import Dispatcher, Limiter
from orchestrator.requirements import Decision, RunRequirement
from orchestrator.run import RunOutput, RunRecord
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Store
from orchestrator.store.endings import CANCELLABLE

__all__ = ["CANCELLABLE", "RunControl", "derived_run_id"]

log = logging.getLogger("ratchet.control")
S = RunStatus
#: Tries of one continue whose guarded move keeps matching nothing: each lost try means another
#: writer moved the run in between, so this bounds a continue that keeps losing, not a wait.
_TRIES = 5


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
        #: A decision's check against what the catalog says is served now (`orchestrator.paused_tools`).
        self.door = paused_tools.CatalogDoor(settings)

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
        webhook: str | None = None,
        run_timeout: float | timedelta | None = None,
    ) -> str:
        """Write the run and its user message (QUEUED), publish its first step; return its id.
        `stream`: its model steps publish their text deltas as live events (`Client.stream`).
        `user_id`: who the run is for. A session is its first run's user's (None included): a run
        for another user in it is SessionOwnedError, and nothing is written, checked in the
        statement or transaction that writes the run, so of two first runs racing for one
        session one user's is written. `session_state`: merged over the session's stored state,
        key by key, when the run is written (`orchestrator.state`). `priority`: 0-9, higher first
        (None: none, as 0); every step of the run is published with it. `webhook`: a URL told of
        each stop of the run (`orchestrator.webhooks`), checked here against RATCHET_WEBHOOK_ALLOW.
        `run_timeout`: its deadline, in seconds from now (None: its agent's `run_timeout`, if any):
        past it, the sweeper stops it in ERROR with RunTimeoutError (`orchestrator.deadlines`).
        A bound on QUEUED runs that is full refuses the start with QueueFullError, nothing
        written (`orchestrator.starting`).

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
            webhook=None if webhook is None else webhooks.check_url(webhook, self.settings),
            run_timeout=run_timeout,
        )
        run_id = str(uuid.uuid4()) if run_id is None else validation.run_id(run_id)
        record = starting.write(self.store, self.settings, request, run_id)
        if record is not None:
            self.publish(record)
        return run_id

    def _definition(self, name: str) -> tuple[str, str | None]:
        """The kind of agent `name` and the hash of its definition (`starting.definition`)."""
        return starting.definition(self.store, self.settings, name)

    def publish(self, record: RunRecord) -> None:
        """Publish the step a QUEUED run is due for. If the broker refuses it, mark the run due at
        once, so the first sweep after the broker is back publishes it, and raise
        BrokerUnavailableError naming the run: nothing is lost."""
        step = starting.first_step(self.store, self.settings, record)
        try:
            self.dispatcher.publish(step)
        except Exception as exc:
            self.store.mark_due(record.run_id, epoch=record.epoch)
            raise BrokerUnavailableError(
                f"run {record.run_id} is saved as QUEUED but its step could not be published ({type(exc).__name__}: "
                f"{exc}); nothing is lost: the workers' sweeper (or `ratchet sweep`) publishes it once the broker "
                "is reachable",
                run_id=record.run_id,
            ) from exc

    # ---------------------------------------------------------------- continue and fork

    def decide(self, run_id: str, requirement_id: str, decision: Decision, *, by: str | None = None) -> RunRequirement:
        """Store a person's decision on one requirement of a PAUSED run (or of its member runs)
        and return the requirement as stored. The last pending requirement of its run queues the
        run again (same run_id) and publishes its step. Idempotent: the same decision again is a
        no-op; another one is DecisionConflictError naming who decided first (`store/paused.py`).
        A decision that would run the paused call, or answer it as its tool, is refused with
        PausedToolChangedError when the newest live definition of its agent in the catalog changed
        that tool since the pause, and nothing is stored (`orchestrator.paused_tools`)."""
        requirement, resumed = self._stored(run_id, requirement_id, decision, by)
        if resumed is not None:
            self.publish(resumed)  # a broker that is down: the run is due, the sweeper publishes it
        return requirement

    def _stored(
        self, run_id: str, requirement_id: str, decision: Decision, by: str | None
    ) -> tuple[RunRequirement, RunRecord | None]:
        """A decision checked and stored; the requirement, and the run it queued again (if any)."""
        run_id = validation.known_run_id(run_id)
        requirement_id = validation.requirement_id(requirement_id)
        if by is not None:
            by = validation.decider(by)
        done = self.store.requirements.decide(
            run_id, requirement_id, decision, by=by, publish_grace=self.settings.publish_grace_seconds, door=self.door
        )
        return done.requirement, done.resumed

    def _decide_all(self, run_id: str, requirements: Sequence[RunRequirement], by: str | None) -> bool:
        """Store the decisions made on `requirements` (those with one), every one before any
        publish, then publish the runs they queued again: a broker that is down loses no decision
        (BrokerUnavailableError once all are stored; the sweeper publishes the runs). Whether any
        decision was given."""
        queued: list[RunRecord] = []
        decided = [r for r in requirements if r.decision is not None and r.is_active]
        for requirement in decided:
            assert requirement.decision is not None
            _, resumed = self._stored(run_id, requirement.id, requirement.decision, by)
            if resumed is not None:
                queued.append(resumed)
        down: BrokerUnavailableError | None = None
        for record in queued:
            try:
                self.publish(record)
            except BrokerUnavailableError as exc:
                down = down or exc
        if down is not None:
            raise down
        return bool(decided)

    def continue_run(
        self,
        run_id: str,
        *,
        input: str | None = None,
        fork_key: str | None = None,
        requirements: Sequence[RunRequirement] = (),
        by: str | None = None,
        run_timeout: float | timedelta | None = None,
        accept_definition: str | Mapping[str, str] | None = None,
    ) -> str:
        """Resume a run and return the id of the run that goes on: ERROR and expired RUNNING
        resume in place; COMPLETED forks; QUEUED and WAITING are going already (no-op); PAUSED
        resumes once every requirement is decided (the decisions in `requirements`, those given
        one with a mutator, are stored first, one by one, as `decide` does); CANCELLED is refused.
        The move out of the run's status is guarded by its epoch, so two concurrent continues
        publish one step (`orchestrator.continuing`).

        `accept_definition`: the hash of a definition the run may go on under although it changed
        what its next step depends on (`DefinitionChangedError`, `orchestrator.deploys`), or, for
        a team, agent names to hashes for its failed members; one a worker served (`_accepted`),
        recorded on each run the continue moves on for a worker of it to take the run over.

        A continue answers only for a move it made or found made. When its guarded move matches
        nothing, the run moved since it was read (another continue, a cancel, its worker, a
        prune), and it decides again on the run as it is then: a run deleted meanwhile is
        RunNotFoundError, a cancelled one RunNotContinuableError, and a run that another request
        resumed gets that request's answer (its run_id) unless this continue carries input, which
        would be dropped: RunBusyError, nothing added.

        The run that goes on keeps its deadline while it is ahead; `run_timeout` gives it a new
        one, that many seconds from now, and a deadline that passed is given again from now
        (its stored `run_timeout`), so a run stopped by RunTimeoutError goes on
        (`orchestrator.continuing`). A run the continue leaves as it is (going, PAUSED) takes
        no `run_timeout`: RunBusyError, as for input."""
        run_id = validation.known_run_id(run_id)
        if input is not None:
            input = validation.input_text(input)
        timeout = None if run_timeout is None else validation.run_timeout(run_timeout)
        if fork_key is not None:
            fork_key = validation.fork_key(fork_key)
        accepted = self._accepted(run_id, accept_definition)
        decided = self._decide_all(run_id, requirements, by)
        carries = input is not None or timeout is not None or bool(accepted)
        if decided and not carries and self.store.get_record(run_id).status != S.ERROR:
            # The decisions are the continue: the last one queued the run (which may have finished
            # since: a fork now would ask the model again for nothing), or it waits for more. A team
            # in ERROR (a member failed beside the paused one) is continued as well.
            return run_id
        return self._resume(run_id, input, fork_key, timeout, accepted)

    def _resume(
        self, run_id: str, input: str | None, fork_key: str | None, timeout: float | None, accepted: dict[str, str]
    ) -> str:
        """The continue's guarded move, decided again on the run as it is each time it raced."""
        continuation = Continuation(
            self.store,
            self.settings,
            publish=self.publish,
            continue_member=lambda member: self.continue_run(member, accept_definition=accepted or None),
            definition_hash=lambda name: self._definition(name)[1],
            accepted=accepted,
        )
        raced = False
        for _ in range(_TRIES):
            answer = continuation.resume(
                self.store.get_record(run_id), input, fork_key, raced=raced, run_timeout=timeout
            )
            if answer is not None:
                return answer
            raced = True
        raise RunBusyError(
            f"run {run_id} changed {_TRIES} times while this continue tried to resume it; nothing was added: "
            "continue it again"
        )

    def _accepted(self, run_id: str, accept: str | Mapping[str, str] | None) -> dict[str, str]:
        """A continue's `accept_definition` checked, by agent name (a hash alone is the run's own
        agent's): each a definition this process defines or a worker served."""
        if accept is None:
            return {}
        checked = validation.accept_definition(accept)
        record = self.store.get_record(run_id)  # an unknown run is RunNotFoundError, before any hash
        by_name = {record.agent_name: checked} if isinstance(checked, str) else checked
        for name, definition_hash in by_name.items():
            agent = registry.find_agent(name)
            if agent is not None and catalog.describe(agent).hash == definition_hash:
                continue
            if not any(row.definition_hash == definition_hash for row in self.store.catalog.read(name)):
                raise InvalidInputError(
                    f"accept_definition: no worker ever served definition {definition_hash[:12]} of {name!r}, "
                    f"so there is nothing to accept; `ratchet agents {name}` lists the definitions workers served"
                )
        return by_name

    # ---------------------------------------------------------------- cancel

    def cancel(self, run_id: str) -> RunOutput:
        """Cancel a run that has not finished, and its member runs; return the run as it ended.
        Its in-flight step is fenced by the epoch the move bumps. A CANCELLED run is a no-op; a
        COMPLETED one, RunNotContinuableError. Members that end meanwhile are left as they ended.

        A PAUSED run is cancelled as any: what it asked of a person is void, and a decision that
        races the cancel either comes first (it is stored and queues the run, which the cancel
        then cancels) or is refused with RunNotPausedError (`store/endings.py`). A member cancelled
        on its own hands its team a tool error, PAUSED for it or WAITING."""
        run_id = validation.known_run_id(run_id)
        record = self.store.get_record(run_id)
        if record.status == S.COMPLETED:
            raise RunNotContinuableError(f"run {run_id} is COMPLETED; there is nothing to cancel")
        if record.status == S.CANCELLED:
            return self.store.get_output(run_id)
        cancelled = self.store.endings.cancel(record)
        if cancelled is None:
            # It ended between the read and the move: another cancel won, or it completed.
            if self.store.get_record(run_id).status == S.COMPLETED:
                raise RunNotContinuableError(f"run {run_id} completed before it could be cancelled")
            return self.store.get_output(run_id)
        self._release(cancelled)
        self._turn(cancelled)
        self._cancel_members(run_id)
        # A member cancelled on its own must not leave its team waiting forever.
        self._member_cancelled(record)
        return self.store.get_output(run_id)

    def _release(self, record: RunRecord) -> None:
        """A cancelled run frees its place among its key's runs (`orchestrator.limits`) for the
        next run waiting, whose step is published here (or by the sweeper, if that fails)."""
        if self.settings.max_runs_per_key is None:
            return
        step = limits.release(self.settings, self._limiter, record)
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

    def _turn(self, record: RunRecord) -> None:
        """A cancelled run a run of its session waits behind gives the first one waiting its
        turn (`store/turns.py`), published here; if that fails, the sweeper gives it."""
        try:
            woken = self.store.turns.wake(record, publish_grace=self.settings.publish_grace_seconds)
            if woken is not None:
                self.publish(woken)
        except Exception as exc:
            log.warning(
                "run %s: the next run of its session could not be given its turn (%s); the sweeper will",
                record.run_id,
                exc,
            )

    def _cancel_members(self, run_id: str) -> None:
        """Cancel a cancelled team's member runs, and theirs. A member that completes or is
        cancelled meanwhile fails its move and is skipped, so the cascade always finishes; its
        team is cancelled already, so its fan-in changes nothing."""
        for child in self.store.children(run_id):
            if child.status in CANCELLABLE and self.store.endings.cancel(child) is not None:
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
