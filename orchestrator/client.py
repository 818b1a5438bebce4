"""The producer side: start, continue, cancel and read runs, for code that need not import the
agents. `Agent.run()` and friends are thin wrappers around a `Client`.

    client = Client()
    handle = client.start("a-team", input="hello", session_id="sess-A")
    output = handle.wait(timeout=60)
"""

from __future__ import annotations

import asyncio
import time
import uuid

from sqlalchemy.exc import IntegrityError

from orchestrator import agent as registry
from orchestrator import delegation
from orchestrator.errors import (
    BrokerUnavailableError,
    ConfigurationError,
    RatchetError,
    RunBusyError,
    RunNotContinuableError,
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
            self._store = Store.open(self.settings.database_url, auto_migrate=self.settings.auto_migrate)
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

        If the broker is down the run is still saved, and BrokerUnavailableError names it; the
        sweeper publishes it when the broker is back."""
        if not isinstance(agent, str) or not agent:
            raise ConfigurationError("start() needs the name of a registered agent or team")
        if not isinstance(input, str) or not input.strip():
            raise ConfigurationError("start() needs a non-empty input message")
        run_id = run_id or str(uuid.uuid4())
        session_id = session_id or str(uuid.uuid4())
        try:
            kind = registry.get_agent(agent).kind
        except RatchetError:
            kind = "agent"  # a producer need not import the agents; the worker knows them
        try:
            record = self.store.create_run(
                run_id=run_id, session_id=session_id, agent_name=agent, kind=kind,
                input_messages=[Message(role="user", content=input)],
                publish_grace=self.settings.publish_grace_seconds,
            )  # fmt: skip
        except IntegrityError:
            raise ConfigurationError(f"a run with run_id {run_id!r} already exists; use a new id") from None
        self.publish(record)
        return RunHandle(run_id, self)

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

    def continue_run(self, run_id: str, *, input: str | None = None) -> RunHandle:
        """Resume a run: ERROR/PAUSED and expired RUNNING resume in place (same run_id);
        COMPLETED forks a new run; QUEUED and WAITING are already going (no-op); CANCELLED is refused.

        Two concurrent continues of one run publish one step: the move is guarded by the epoch."""
        record = self.store.get_record(run_id)
        now = self.store.clock()
        status = record.status
        if status == S.CANCELLED:
            raise RunNotContinuableError(f"run {run_id} was cancelled; a cancelled run is final. Start a new run.")
        if status == S.COMPLETED:
            return self._fork(record, input)
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

    def _fork(self, record: RunRecord, input: str | None) -> RunHandle:
        messages = self.store.get_messages(record.run_id)
        if input is not None:
            messages.append(Message(role="user", content=input))
        fork_id = str(uuid.uuid4())
        created = self.store.create_run(
            run_id=fork_id, session_id=record.session_id, agent_name=record.agent_name, kind=record.kind,
            input_messages=[m.model_copy(update={"created_at": None}) for m in messages],
            # A fork of a member's run is the user's own run, not a member of the team any more.
            publish_grace=self.settings.publish_grace_seconds, parent_run_id=None,
            forked_from=record.run_id, system_message=record.system_message,
        )  # fmt: skip
        self.publish(created)
        return RunHandle(fork_id, self)

    def cancel(self, run_id: str) -> RunOutput:
        """Cancel a run that has not finished. Its in-flight step is fenced: nothing it does
        afterwards is committed. Cancelling a CANCELLED run is a no-op; a COMPLETED one, an error."""
        record = self.store.get_record(run_id)
        if record.status == S.COMPLETED:
            raise RunNotContinuableError(f"run {run_id} is COMPLETED; there is nothing to cancel")
        if record.status != S.CANCELLED:
            self.store.move(
                run_id, src=(S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED, S.ERROR), dst=S.CANCELLED, bump_epoch=True,
                event="cancel", lease_owner=None, lease_expires_at=None, publish_after=None, next_step=None,
            )  # fmt: skip
            for child in self.store.children(run_id):
                if child.status not in (S.COMPLETED, S.CANCELLED):
                    self.cancel(child.run_id)
            # A member cancelled on its own must not leave its team waiting forever.
            delegation.member_cancelled(self, record)
        return self.store.get_output(run_id)

    # ---------------------------------------------------------------- reads

    def get_run(self, run_id: str) -> RunOutput:
        """The run with its messages and member runs; RunNotFoundError if there is none."""
        return self.store.get_output(run_id)

    def get_session(self, session_id: str) -> Session | None:
        """The session's runs, oldest first; None if no run was ever started in it."""
        return self.store.get_session(session_id)

    def wait(self, run_id: str, timeout: float | None = None) -> RunOutput:
        """Block until the run stops (COMPLETED, ERROR, CANCELLED, PAUSED).

        On PostgreSQL the run's final move wakes the waiter at once (LISTEN/NOTIFY), with a
        slow poll as a safety net; elsewhere, or while notices are down, it polls."""
        deadline = None if timeout is None else time.monotonic() + timeout
        watcher = self.store.final_watcher()
        event = watcher.subscribe(run_id) if watcher is not None else None
        delay = 0.002
        notified = False
        try:
            while True:
                if notified:  # most likely final: read the output at once (one transaction, not two)
                    output = self.store.get_output(run_id)
                    if output.status.is_final:
                        return output
                elif self.store.get_record(run_id).status.is_final:
                    return self.store.get_output(run_id)
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
                    time.sleep(delay if left is None else min(delay, left))
                    delay = min(delay * 1.5, 0.1)
        finally:
            if event is not None and watcher is not None:
                watcher.unsubscribe(run_id, event)

    async def await_run(self, run_id: str, timeout: float | None = None) -> RunOutput:
        """`wait()` for asyncio."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.002
        while True:
            record = await asyncio.to_thread(self.store.get_record, run_id)
            if record.status.is_final:
                return await asyncio.to_thread(self.store.get_output, run_id)
            if deadline is not None and time.monotonic() >= deadline:
                raise RunWaitTimeout(
                    f"run {run_id} is still going after {timeout}s; wait again or `ratchet show {run_id}`"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.1)
