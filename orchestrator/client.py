"""The producer side: start, continue, cancel and read runs, for code that need not import the
agents. `Agent.run()` and friends are thin wrappers around a `Client`.

    client = Client()
    handle = client.start("a-team", input="hello", session_id="sess-A")
    output = handle.wait(timeout=60)
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator

from sqlalchemy.exc import IntegrityError

from orchestrator import agent as registry
from orchestrator import delegation, validation
from orchestrator.errors import (
    BrokerUnavailableError,
    RatchetError,
    RunBusyError,
    RunConflictError,
    RunNotContinuableError,
    RunNotFoundError,
    RunWaitTimeout,
)
from orchestrator.messages import Message, unanswered_calls
from orchestrator.ports import Dispatcher, StepRef, get_dispatcher
from orchestrator.run import RunOutput, RunRecord, Session
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Store

S = RunStatus
#: Seconds between reads of a waited-for run when notifications wake the waiter anyway.
SAFETY_POLL = 0.5
#: Where a cancel applies (COMPLETED and CANCELLED are final).
CANCELLABLE = (S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED, S.ERROR)
#: The namespace of the run ids Ratchet derives. Fixed for good: a new one would make a request
#: repeated across an upgrade start a second run.
_DERIVED_IDS = uuid.UUID("9b3c1e52-6f0a-4d8e-a5b7-2c4e8f1d3a60")


def derived_run_id(*parts: str) -> str:
    """A run id that is a function of `parts` (uuid5): the same request finds the same run.

    The fork of a run (`"fork", run_id, "key" | "input", text`) and the run of a `ratchet.start_run`
    task sent without a run id (`"celery-task", task_id`) get theirs this way."""
    return str(uuid.uuid5(_DERIVED_IDS, json.dumps(parts)))


def poll_delays() -> Iterator[float]:
    """How long a waiter sleeps between reads of a run it cannot be notified about (SQLite, or
    while PostgreSQL notices are down): every millisecond for the first 50 ms, where most short
    runs end and a coarser schedule would add its own granularity to their latency, then backing
    off to one read every 100 ms. A SQLite read costs tens of microseconds."""
    for _ in range(50):
        yield 0.001
    delay = 0.001
    while True:
        delay = min(delay * 1.5, 0.1)
        yield delay


class RunHandle:
    """A started run: its id, and a way to wait for it."""

    def __init__(self, run_id: str, client: Client) -> None:
        self.run_id = run_id
        self._client = client

    def status(self) -> RunStatus:
        """The run's current status (one read)."""
        return self._client.store.get_record(self.run_id).status

    def wait(self, timeout: float | None = None) -> RunOutput:
        """Block until the run is COMPLETED, ERROR, CANCELLED or PAUSED; return its output.

        Raises RunWaitTimeout after `timeout` seconds (the run itself goes on)."""
        return self._client.wait(self.run_id, timeout)

    async def await_(self, timeout: float | None = None) -> RunOutput:
        """`wait()` for asyncio: polls without blocking the event loop."""
        return await self._client.await_run(self.run_id, timeout)

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r})"


class Client:
    """Producer API over the run store and the broker."""

    def __init__(
        self, settings: Settings | None = None, *, store: Store | None = None, dispatcher: Dispatcher | None = None
    ) -> None:
        self.settings = settings or Settings.from_env()
        self._store = store
        self._dispatcher = dispatcher

    @property
    def store(self) -> Store:
        """The run store (opened, and migrated when RATCHET_AUTO_MIGRATE is on, on first use)."""
        if self._store is None:
            self._store = Store.open(
                self.settings.database_url,
                auto_migrate=self.settings.auto_migrate,
                sqlite_synchronous=self.settings.sqlite_synchronous,
            )
        return self._store

    @property
    def dispatcher(self) -> Dispatcher:
        """Where steps are published (RATCHET_DISPATCHER, Celery by default)."""
        if self._dispatcher is None:
            self._dispatcher = get_dispatcher(self.settings)
        return self._dispatcher

    # ---------------------------------------------------------------- writes

    def start(self, agent: str, *, input: str, session_id: str | None = None, run_id: str | None = None) -> RunHandle:
        """Write the run and its user message (QUEUED), then publish its first step.

        `run_id` is the producer's own key (default: a new uuid4; 1-64 characters of A-Z, a-z,
        0-9, `.`, `_`, `:` and `-`): starting again with a run_id that exists, for the same agent
        (and the same session, if one is given), returns that run and publishes nothing; for
        another agent or session it raises RunConflictError. Invalid arguments raise
        InvalidInputError before anything is written.

        If the broker is down the run is still saved, and BrokerUnavailableError names it; the
        sweeper publishes it when the broker is back."""
        agent = validation.agent_name(agent)
        input = validation.input_text(input)
        given_session = None if session_id is None else validation.session_id(session_id)
        run_id = str(uuid.uuid4()) if run_id is None else validation.run_id(run_id)
        try:
            kind = registry.get_agent(agent).kind
        except RatchetError:
            kind = "agent"  # a producer need not import the agents; the worker knows them
        try:
            record = self.store.create_run(
                run_id=run_id, session_id=given_session or str(uuid.uuid4()), agent_name=agent, kind=kind,
                input_messages=[Message(role="user", content=input)],
                publish_grace=self.settings.publish_grace_seconds,
            )  # fmt: skip
        except IntegrityError as exc:
            existing = self._existing(run_id, exc)
            if existing.agent_name != agent or given_session not in (None, existing.session_id):
                raise RunConflictError(
                    f"run_id {run_id!r} is already a run of agent {existing.agent_name!r} in session "
                    f"{existing.session_id!r}; a run of agent {agent!r}"
                    f"{'' if given_session is None else f' in session {given_session!r}'} needs a run_id of its own"
                ) from None
            return RunHandle(run_id, self)  # the same start again: a retry, a redelivery
        self.publish(record)
        return RunHandle(run_id, self)

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
        step = StepRef.of(record)
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

    def continue_run(self, run_id: str, *, input: str | None = None, fork_key: str | None = None) -> RunHandle:
        """Resume a run: ERROR/PAUSED and expired RUNNING resume in place (same run_id);
        COMPLETED forks a new run; QUEUED and WAITING are already going (no-op); CANCELLED is refused.

        Two concurrent continues of one run publish one step: the move is guarded by the epoch.
        A fork's run_id is derived from the source run and `fork_key` (default: the input), so
        continuing a COMPLETED run twice alike returns the same fork; another `fork_key` forks
        again."""
        run_id = validation.known_run_id(run_id)
        if input is not None:
            input = validation.input_text(input)
        if fork_key is not None:
            fork_key = validation.fork_key(fork_key)
        record = self.store.get_record(run_id)
        now = self.store.clock()
        status = record.status
        if status == S.CANCELLED:
            raise RunNotContinuableError(f"run {run_id} was cancelled; a cancelled run is final. Start a new run.")
        if status == S.COMPLETED:
            return self._fork(record, input, fork_key)
        if status in (S.QUEUED, S.WAITING):
            if input is not None:
                raise RunBusyError(f"run {run_id} is {status}; it cannot take new input until it stops")
            return RunHandle(run_id, self)
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
        if owed and status == S.ERROR and delegation.continue_team(self, record, owed):
            return RunHandle(run_id, self)
        new = [Message(role="user", content=input)] if input is not None else []
        moved = self.store.move(
            run_id, src=(status,), dst=S.QUEUED, epoch=record.epoch, bump_epoch=True, event="continue",
            new_messages=new, seq=record.seq + 1, next_step="tools" if owed else "model", attempts=0, retries=0,
            lease_owner=None, lease_expires_at=None, error_type=None, error_message=None,
            publish_after=now + self.settings.publish_grace_seconds,
        )  # fmt: skip
        if moved is not None:
            self.publish(moved)
        return RunHandle(run_id, self)

    def _fork(self, record: RunRecord, input: str | None, key: str | None) -> RunHandle:
        # The fork's id is a function of the request, so a double-clicked or redelivered continue
        # finds the fork the first one made instead of making another.
        request = ("key", key) if key is not None else ("input", input or "")
        fork_id = derived_run_id("fork", record.run_id, *request)
        try:
            return self._same_fork(record, self.store.get_record(fork_id))
        except RunNotFoundError:
            pass
        messages = self.store.get_messages(record.run_id)
        if input is not None:
            messages.append(Message(role="user", content=input))
        try:
            created = self.store.create_run(
                run_id=fork_id, session_id=record.session_id, agent_name=record.agent_name, kind=record.kind,
                input_messages=[m.model_copy(update={"created_at": None}) for m in messages],
                # A fork of a member's run is the user's own run, not a member of the team any more.
                publish_grace=self.settings.publish_grace_seconds, parent_run_id=None,
                forked_from=record.run_id, system_message=record.system_message,
            )  # fmt: skip
        except IntegrityError as exc:  # a concurrent continue made it first
            return self._same_fork(record, self._existing(fork_id, exc))
        self.publish(created)
        return RunHandle(fork_id, self)

    def _same_fork(self, source: RunRecord, fork: RunRecord) -> RunHandle:
        if fork.forked_from != source.run_id:  # only a producer that chose this very id gets here
            raise RunConflictError(f"run_id {fork.run_id!r}, the id of this fork, is taken by another run")
        return RunHandle(fork.run_id, self)

    def cancel(self, run_id: str) -> RunOutput:
        """Cancel a run that has not finished, and its member runs. Its in-flight step is fenced:
        nothing it does afterwards is committed. Cancelling a CANCELLED run is a no-op; a
        COMPLETED one, an error. Members that end while the cancel goes on are left as they ended."""
        run_id = validation.known_run_id(run_id)
        record = self.store.get_record(run_id)
        if record.status == S.COMPLETED:
            raise RunNotContinuableError(f"run {run_id} is COMPLETED; there is nothing to cancel")
        if record.status == S.CANCELLED:
            return self.store.get_output(run_id)
        if self._cancel_one(run_id) is None:
            # It ended between the read and the move: another cancel won, or it completed.
            if self.store.get_record(run_id).status == S.COMPLETED:
                raise RunNotContinuableError(f"run {run_id} completed before it could be cancelled")
            return self.store.get_output(run_id)
        self._cancel_members(run_id)
        # A member cancelled on its own must not leave its team waiting forever.
        delegation.member_cancelled(self, record)
        return self.store.get_output(run_id)

    def _cancel_one(self, run_id: str) -> RunRecord | None:
        """Move one run to CANCELLED; None if it is COMPLETED or CANCELLED already."""
        return self.store.move(
            run_id, src=CANCELLABLE, dst=S.CANCELLED, bump_epoch=True, event="cancel",
            lease_owner=None, lease_expires_at=None, publish_after=None, next_step=None,
        )  # fmt: skip

    def _cancel_members(self, run_id: str) -> None:
        """Cancel a cancelled team's member runs, and theirs. A member that completes or is
        cancelled meanwhile fails its move and is skipped, so the cascade always finishes; its
        team is cancelled already, so its fan-in changes nothing."""
        for child in self.store.children(run_id):
            if child.status not in (S.COMPLETED, S.CANCELLED) and self._cancel_one(child.run_id) is not None:
                self._cancel_members(child.run_id)

    # ---------------------------------------------------------------- reads

    def get_run(self, run_id: str) -> RunOutput:
        """The run with its messages and member runs; RunNotFoundError if there is none."""
        return self.store.get_output(validation.known_run_id(run_id))

    def get_session(self, session_id: str) -> Session | None:
        """The session's runs, oldest first; None if no run was ever started in it."""
        return self.store.get_session(validation.session_id(session_id))

    def wait(self, run_id: str, timeout: float | None = None) -> RunOutput:
        """Block until the run stops (COMPLETED, ERROR, CANCELLED, PAUSED).

        On PostgreSQL the run's final move wakes the waiter at once (LISTEN/NOTIFY), with a
        slow poll as a safety net; elsewhere, or while notices are down, it polls."""
        run_id = validation.known_run_id(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        watcher = self.store.final_watcher()
        event = watcher.subscribe(run_id) if watcher is not None else None
        delays = poll_delays()
        notified = False
        try:
            while True:
                if notified:  # most likely final: read the output at once (one transaction, not two)
                    output = self.store.get_output(run_id)
                    if output.status.is_final:
                        return output
                elif (stopped := self.store.final_output(run_id)) is not None:
                    return stopped
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RunWaitTimeout(
                        f"run {run_id} is still going after {timeout}s; wait again or `ratchet show {run_id}`"
                    )
                if event is not None and watcher is not None and watcher.listening:
                    notified = event.wait(SAFETY_POLL if left is None else min(SAFETY_POLL, left))
                    event.clear()
                else:
                    notified = False
                    delay = next(delays)
                    time.sleep(delay if left is None else min(delay, left))
        finally:
            if event is not None and watcher is not None:
                watcher.unsubscribe(run_id, event)

    async def await_run(self, run_id: str, timeout: float | None = None) -> RunOutput:
        """`wait()` for asyncio."""
        run_id = validation.known_run_id(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        delays = poll_delays()
        while True:
            output = await asyncio.to_thread(self.store.final_output, run_id)
            if output is not None:
                return output
            if deadline is not None and time.monotonic() >= deadline:
                raise RunWaitTimeout(
                    f"run {run_id} is still going after {timeout}s; wait again or `ratchet show {run_id}`"
                )
            await asyncio.sleep(next(delays))
