"""The producer side: start, continue, cancel and read runs, for code that need not import the
agents. `Agent.run()` and friends are thin wrappers around a `Client`.

`Client` is a facade over a runtime (`orchestrator.runtime`: the store, the dispatcher, the delta
sink, the limiter): it reads and waits for runs, and hands every write to
`orchestrator.control.RunControl`, which the Celery tasks call too. `Client()` uses the process's
runtime for the environment's settings, built on first use.

    client = Client()
    handle = client.start("a-team", input="hello", session_id="sess-A")
    output = handle.wait(timeout=60)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, Unpack

from orchestrator import batches, schedules, timeline, validation, webhooks
from orchestrator.batches import Batch, Moment, Selection
from orchestrator.control import RunControl
from orchestrator.errors import DecisionKindError, InvalidInputError, RunWaitTimeout
from orchestrator.events import RunEvent
from orchestrator.ports import DeltaSink, Dispatcher, QueueLengths
from orchestrator.reader import Follower, afollow, follow
from orchestrator.requirements import Decision, RunRequirement
from orchestrator.run import LogEntry, RunOutput, RunPage, Session
from orchestrator.runtime import Runtime, build, current
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Store, retention
from orchestrator.store.listing import RunFilter
from orchestrator.store.metrics import MetricsSnapshot
from orchestrator.store.retention import Deleted
from orchestrator.store.schedule_rows import Schedule
from orchestrator.timeline import Step
from orchestrator.webhooks import WebhookDelivery

log = logging.getLogger("ratchet.client")
#: Seconds between reads of a waited-for run when notifications wake the waiter anyway.
SAFETY_POLL = 0.5


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
    """Producer API over the run store and the broker.

    `Client()` takes the settings from the environment; `Client(settings)` the process's runtime
    for those (`runtime.current`); a `store` or a `dispatcher` given replaces that part, the
    others staying the process's (`runtime.build`); `runtime=` is used as it is. Nothing is
    opened until the client is first used."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        store: Store | None = None,
        dispatcher: Dispatcher | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        if runtime is not None and (settings, store, dispatcher) != (None, None, None):
            raise TypeError("Client takes a runtime, or settings and the parts to replace, not both")
        self.settings = runtime.settings if runtime is not None else settings or Settings.from_env()
        self._runtime = runtime
        self._parts = (store, dispatcher)
        self._control: RunControl | None = None

    @property
    def runtime(self) -> Runtime:
        """The store, dispatcher, delta sink, limiter and final channel this client uses (the
        process's, on first use, unless it was given parts of its own)."""
        if self._runtime is None:
            store, dispatcher = self._parts
            if store is None and dispatcher is None:
                self._runtime = current(self.settings)
            else:
                self._runtime = build(self.settings, store=store, dispatcher=dispatcher)
        return self._runtime

    @property
    def store(self) -> Store:
        """The run store (opened, and migrated when RATCHET_AUTO_MIGRATE is on, on first use)."""
        return self.runtime.store

    @property
    def dispatcher(self) -> Dispatcher:
        """Where steps are published (RATCHET_DISPATCHER, Celery by default): run control's."""
        return self.runtime.dispatcher

    @property
    def control(self) -> RunControl:
        """Start, continue and cancel over this client's runtime."""
        if self._control is None:
            runtime = self.runtime
            self._control = RunControl(runtime.store, self.settings, runtime.dispatcher, limiter=runtime.limiter)
        return self._control

    # ---------------------------------------------------------------- writes

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
    ) -> RunHandle:
        """Write the run and its user message (QUEUED), then publish its first step.

        `run_id` is the producer's own key (default: a new uuid4; 1-64 characters of A-Z, a-z,
        0-9, `.`, `_`, `:` and `-`): starting again with a run_id that exists, with the same
        request (user, agent, input, stream, priority and session_state; the session, if given),
        returns that run and publishes nothing; any other request raises RunConflictError saying
        what differs, or for another user's run nothing of it (`orchestrator.idempotency`).
        Invalid arguments raise InvalidInputError before anything is written. If the broker is
        down the run is still saved, and BrokerUnavailableError names it; the sweeper publishes it
        when the broker is back.

        `user_id`: who the run is for, stored with it (and with its session, if this is the
        session's first run). A session is its first run's user's, no user included: a run for
        another user in it raises SessionOwnedError and writes nothing, and a run's history and
        session state are only ever its own user's. With RATCHET_MAX_RUNS_PER_KEY, also its
        concurrency key (or what its agent's `concurrency_key` makes of the run:
        `orchestrator.limits`). `session_state`: a dict merged over the session's stored state,
        key by key, as the run is written (Agno's `run(session_state=...)`); its tools read and
        change the result (`ToolContext.session_state`).

        `stream=True`: the run's model steps also publish their text deltas, which `stream()`
        merges with its durable events; any run can be followed, streamed or not. `priority`: 0-9,
        higher first; a run without one is as 0. Every step of the run (and of its team members) is
        published with it, so under a backlog its steps are taken before lower ones' on Redis and
        RabbitMQ (the embedded filesystem broker ignores it).

        `webhook`: an http(s) URL POSTed a signed summary each time the run stops (COMPLETED,
        ERROR, CANCELLED, PAUSED), at least once, from a durable outbox (`orchestrator.webhooks`).
        Its host must resolve to public addresses unless RATCHET_WEBHOOK_ALLOW lists it;
        RATCHET_WEBHOOK_SECRET must be set. A refused URL is InvalidInputError, nothing written.

        `run_timeout`: its deadline, seconds (or a timedelta) from now, default its agent's:
        `orchestrator.deadlines`. QueueFullError, nothing written: `orchestrator.starting`."""
        run_id = self.control.start(
            agent,
            input=input,
            session_id=session_id,
            run_id=run_id,
            stream=stream,
            user_id=user_id,
            session_state=session_state,
            priority=priority,
            webhook=webhook,
            run_timeout=run_timeout,
        )
        return RunHandle(run_id, self)

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
    ) -> RunHandle:
        """Resume a run: ERROR and expired RUNNING resume in place (same run_id); COMPLETED
        forks a new run; QUEUED and WAITING are already going (no-op); CANCELLED is refused.
        A team in ERROR because a member failed continues that member in place, then the leader.
        A PAUSED run resumes in place once every requirement is decided: the decisions made on
        `requirements` (with their mutators) are stored first, one by one, as `decide` stores
        them (`by`: who decides, kept with each).

        Two concurrent continues of one run publish one step: the move is guarded by the epoch.
        A fork's run_id is derived from the source run and `fork_key` (default: the input), so
        continuing a COMPLETED run twice alike returns the same fork; another `fork_key` forks
        again.

        The run that goes on keeps a deadline that is still ahead; one that passed (a run stopped
        by RunTimeoutError) is given again from now, as long as the run's `run_timeout`;
        `run_timeout` here gives it a new one from now (a fork: its source's, else none). A run
        the continue leaves going takes no `run_timeout` (RunBusyError).
        `accept_definition`: for a run in ERROR with DefinitionChangedError (a deploy changed what
        its next step depends on: docs/deploys.md), the hash of the definition it may go on under
        anyway, as the error names it; for a team, a mapping of its members' names to hashes.
        A definition no worker ever served is InvalidInputError."""
        answer = self.control.continue_run(
            run_id,
            input=input,
            fork_key=fork_key,
            requirements=requirements,
            by=by,
            run_timeout=run_timeout,
            accept_definition=accept_definition,
        )
        return RunHandle(answer, self)

    def decide(
        self, run_id: str, requirement_id: str, decision: Decision | RunRequirement, *, by: str | None = None
    ) -> RunRequirement:
        """Store one decision on a requirement of a PAUSED run (or of one of its member runs) and
        return the requirement as stored: `decision` is a `Decision`, or a `RunRequirement`
        decided with one of its mutators. The last pending requirement of its run queues the run
        again. The same decision sent again is a no-op; another one is DecisionConflictError
        naming who decided first; past its deadline or the run's DecisionExpiredError; for a run that is not
        PAUSED RunNotPausedError; one that does not answer it DecisionKindError."""
        if isinstance(decision, RunRequirement):
            if decision.decision is None:
                raise DecisionKindError(
                    f"requirement {decision.id} carries no decision: call confirm(), reject(), "
                    "provide_user_input() or set_external_execution_result() on it first"
                )
            decision = decision.decision
        return self.control.decide(run_id, requirement_id, decision, by=by)

    def pending(
        self, *, agent_name: str | None = None, user_id: str | None = None, limit: int = 100
    ) -> list[RunRequirement]:
        """What paused runs wait for, across runs, oldest first (of one agent, of one user's runs)."""
        if agent_name is not None:
            agent_name = validation.agent_name(agent_name)
        if user_id is not None:
            user_id = validation.user_id(user_id)
        return self.store.requirements.pending(
            agent_name=agent_name, user_id=user_id, limit=validation.page_size(limit)
        )

    def cancel(self, run_id: str) -> RunOutput:
        """Cancel a run that has not finished, and its member runs. Its in-flight step is fenced:
        nothing it does afterwards is committed. Cancelling a CANCELLED run is a no-op; a
        COMPLETED one, an error. Members that end while the cancel goes on are left as they ended."""
        return self.control.cancel(run_id)

    def continue_runs(self, run_ids: Sequence[str] | None = None, **selection: Unpack[Selection]) -> Batch:
        """Continue many runs in place at once (`orchestrator.batches`): by id (at most 100), or
        a page of the top-level runs a filter with a status selects (`status="ERROR"`, and
        `agent`, `session_id`, `user_id`, `since`, `until` as `list_runs` takes them; `limit` at
        most 100; `cursor`: the batch's `next_cursor`). Each run as `continue_run` resumes it,
        on its own: one refused (COMPLETED, PAUSED, CANCELLED, gone) is reported with why, and
        the others go on. InvalidInputError, and nothing done, for a batch that names no runs
        or too many."""
        return self._batch("continue", run_ids, selection)

    def cancel_runs(self, run_ids: Sequence[str] | None = None, **selection: Unpack[Selection]) -> Batch:
        """Cancel many runs at once, each as `cancel` does, named as `continue_runs` names them;
        one refused (COMPLETED, gone) is reported with why, and the others go on."""
        return self._batch("cancel", run_ids, selection)

    def _batch(self, action: batches.Action, run_ids: Sequence[str] | None, selection: Selection) -> Batch:
        ids, next_cursor = batches.named(run_ids, selection, self.list_runs)
        return batches.act(self.control, self.store, action, ids, next_cursor=next_cursor)

    # ---------------------------------------------------------------- schedules

    def schedule(
        self,
        agent: str,
        *,
        cron: str,
        input: str,
        timezone: str = "UTC",
        session_id: str | None = None,
        user_id: str | None = None,
        schedule_id: str | None = None,
    ) -> Schedule:
        """Run `agent` with `input` at each tick of `cron` (five fields, or @daily and the like),
        read in the IANA zone `timezone`; return the schedule stored, its first tick the first
        after now. Each tick starts one run, whose id is "<schedule id>:<tick, UTC>", in
        `session_id` if given (else a new session each), for `user_id`. The sweeper fires it
        (`orchestrator.schedules`: exactly one run per tick, missed ticks, clock changes).
        `schedule_id`: 1-40 characters of A-Z, a-z, 0-9, '.', '_' and '-' (default: a new one);
        ScheduleConflictError if it is taken, InvalidInputError for an argument that cannot be taken;
        AgentNotFoundError for an agent nothing here defines and no worker served (as `ratchet run`),
        SessionOwnedError for a `session_id` of another user: nothing written."""
        return schedules.create(
            self.store,
            agent,
            cron_text=cron,
            timezone=timezone,
            input=input,
            session_id=session_id,
            user_id=user_id,
            new_id=schedule_id,
        )

    def schedules(self, *, user_id: str | None = None) -> list[Schedule]:
        """Every schedule (or `user_id`'s), by id, each with its next tick and its last run."""
        return self.store.schedules.all(user_id=None if user_id is None else validation.user_id(user_id))

    def unschedule(self, schedule_id: str) -> None:
        """Delete a schedule: passes that start after this never fire it (the runs it started stay).
        ScheduleNotFoundError if there is none."""
        schedules.delete(self.store, schedule_id)

    # ---------------------------------------------------------------- reads

    def get_run(self, run_id: str) -> RunOutput:
        """The run with its messages and member runs; RunNotFoundError if there is none."""
        return self.store.get_output(validation.known_run_id(run_id))

    def webhook_deliveries(self, run_id: str) -> list[WebhookDelivery]:
        """What the run's webhook was told, one delivery per stop, oldest first: pending (with
        when it is tried next), delivered or failed (with the last error). RunNotFoundError if
        there is no such run."""
        return webhooks.deliveries(self.store, validation.known_run_id(run_id))

    def get_session(self, session_id: str, *, user_id: str | None = None) -> Session | None:
        """The session (its user and state) and its runs, oldest first. None if no run was ever
        started in it, or, with `user_id`, if it is not that user's (a session is its first run's
        user's); then its runs are that user's only."""
        user = None if user_id is None else validation.user_id(user_id)
        return self.store.get_session(validation.session_id(session_id), user)

    def get_session_state(self, session_id: str, *, user_id: str | None = None) -> dict[str, Any]:
        """The session's state as stored now ({} for a new session): one row read. With
        `user_id`, {} unless the session is that user's, as `get_session` is None then."""
        session_id = validation.session_id(session_id)
        if user_id is None:
            return self.store.session_state(session_id)
        return self.store.user_state(session_id, validation.user_id(user_id))

    def list_runs(
        self,
        *,
        status: RunStatus | str | Iterable[RunStatus | str] | None = None,
        agent: str | None = None,
        session_id: str | None = None,
        user_id: str | None = None,
        since: Moment | None = None,
        until: Moment | None = None,
        limit: int = 50,
        cursor: str | None = None,
        members: bool = False,
    ) -> RunPage:
        """A page of runs, newest first (by creation, then run_id): those in `status` (one, or
        several: a list or "ERROR,CANCELLED"), of `agent`, in `session_id`, for `user_id`,
        created at or after `since` and before `until` (UNIX seconds, a datetime, ISO 8601 text,
        or how long ago: "6h"). Top-level runs only unless `members`: a team's member runs show
        under it (`get_run`). `limit`: 1-1000 runs. Pass the page's `next_cursor` as `cursor` for
        the next page; it is None on the last. Each page costs the same however deep, and a run
        started meanwhile never shifts a page. InvalidInputError for a filter that cannot be taken."""
        now = self.store.clock()
        found = RunFilter(
            statuses=validation.statuses(status),
            agent=None if agent is None else validation.agent_name(agent),
            session_id=None if session_id is None else validation.session_id(session_id),
            user_id=None if user_id is None else validation.user_id(user_id),
            since=validation.moment(since, now=now, what="since"),
            until=validation.moment(until, now=now, what="until"),
            members=bool(members),
        )
        cursor = None if cursor is None else validation.cursor(cursor)
        return self.store.list_runs(found, limit=validation.page_size(limit), cursor=cursor)

    def get_log(self, run_id: str) -> list[LogEntry]:
        """The run's log, oldest first: what happened to it besides its messages (retries,
        errors, leases the sweeper took back, fenced writes, delegations and fan-ins, continues,
        cancels). Not its member runs' (`get_log` each). RunNotFoundError if there is no such run."""
        return self.store.get_log(validation.known_run_id(run_id))

    def get_steps(self, run_id: str) -> list[Step]:
        """The run's steps in order, as a timeline shows them: each one's task (model call, tool
        batch, fan-in), attempt, status, when it could start and ended, its tokens, its failed
        tool calls, its error, and for the step in progress the worker and task holding it
        (`orchestrator.timeline` says what is derived how). RunNotFoundError if there is no such run."""
        rows = self.store.step_rows(validation.known_run_id(run_id))
        return timeline.derive_steps(rows.record, rows.messages, rows.log)

    # ---------------------------------------------------------------- retention

    def delete_session(self, session_id: str) -> Deleted | None:
        """Delete the session and everything stored for it: its runs (member runs included), their
        messages, tool starts, logs, live events (Redis streams too) and webhook deliveries, in
        short batches. None if there is no such session. RunLiveError naming the run, and nothing deleted, if a run
        in it is live (QUEUED, RUNNING, WAITING or PAUSED): cancel it or let it stop first."""
        found = validation.session_id(session_id)
        return retention.delete_session(self.store, found, on_deleted=self._drop_streams)

    def prune(
        self, older_than: float | timedelta | str, *, status: RunStatus | str | Iterable[RunStatus | str] | None = None
    ) -> Deleted:
        """Delete the stopped runs (COMPLETED, ERROR, CANCELLED; or those of `status`) that
        nothing has changed for `older_than` (seconds, a timedelta, or "30d"), with everything
        stored for them, in short batches, oldest first. A team goes with its member runs; a
        team tree with a live run in it, or changed since, is kept (`Deleted.kept`). Runs
        started meanwhile are newer than the cut, so a prune can run while producers work.
        Sessions stay (their ids, user and state: a conversation may go on); `delete_session`
        deletes one whole."""
        seconds = validation.duration(older_than)
        statuses = validation.statuses(status) or retention.STOPPED
        if live := [s.value for s in statuses if s not in retention.STOPPED]:
            raise InvalidInputError(
                f"prune deletes stopped runs only ({', '.join(retention.STOPPED)}), never live ones: "
                f"drop {', '.join(live)} from status"
            )
        cutoff = self.store.clock() - seconds
        return retention.prune(self.store, cutoff=cutoff, statuses=statuses, on_deleted=self._drop_streams)

    def _drop_streams(self, deleted: Deleted) -> None:
        if deleted.streamed:
            self.delta_sink.discard(deleted.streamed)

    @property
    def delta_sink(self) -> DeltaSink:
        """Where streamed runs' live events are read from (RATCHET_REDIS_URL's Redis, or the store)."""
        return self.runtime.deltas

    def stream(self, run_id: str, *, after: str | None = None, timeout: float | None = None) -> Iterator[RunEvent]:
        """The run's events in id order as they happen, from the first (or the one after the id
        `after`: a reader that reconnects with the last id it saw gets exactly the rest), until
        the run is final or PAUSED. Durable events are rebuilt from the database, so a run that
        ended long ago, or was started elsewhere, yields them all; a run started with
        stream=True also yields its RunContent deltas (drop a step's deltas that sort before its
        StepRestarted). RunWaitTimeout after `timeout` seconds; the run goes on."""
        return follow(self._follower(run_id, after), timeout)

    def astream(
        self, run_id: str, *, after: str | None = None, timeout: float | None = None
    ) -> AsyncIterator[RunEvent]:
        """`stream()` for asyncio: `async for event in client.astream(run_id)`."""
        return afollow(self._follower(run_id, after), timeout)

    def _follower(self, run_id: str, after: str | None) -> Follower:
        """A reader of the run; an unknown run or a malformed `after` fails here, when the caller
        asks to stream (an HTTP API answers 404 or 422 before it starts a response), not later."""
        run_id = validation.known_run_id(run_id)
        follower = Follower(self.store, self.delta_sink, run_id, after)
        self.store.get_record(run_id)
        return follower

    def wait(self, run_id: str, timeout: float | None = None) -> RunOutput:
        """Block until the run stops (COMPLETED, ERROR, CANCELLED, PAUSED).

        On PostgreSQL the run's final move wakes the waiter at once (LISTEN/NOTIFY), with a
        slow poll as a safety net; elsewhere, or while notices are down, it polls, and on SQLite
        with RATCHET_REDIS_URL the run's announced final move (`ports.FinalChannel`) also wakes it
        between polls."""
        run_id = validation.known_run_id(run_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        watcher = self.store.final_watcher()
        event = watcher.subscribe(run_id) if watcher is not None else None
        channel = self.runtime.finals if watcher is None else None  # wired with the store
        early = channel.subscribe(run_id) if channel is not None else None
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
                    delay = next(delays)
                    delay = delay if left is None else min(delay, left)
                    if early is not None:  # announced between polls (SQLite with RATCHET_REDIS_URL)
                        notified = early.wait(delay)
                        early.clear()
                    else:
                        notified = False
                        time.sleep(delay)
        finally:
            if event is not None and watcher is not None:
                watcher.unsubscribe(run_id, event)
            if early is not None and channel is not None:
                channel.unsubscribe(run_id, early)

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

    # ---------------------------------------------------------------- metrics

    def metrics(self) -> MetricsSnapshot:
        """What `ratchet api` serves at /metrics: runs by agent and status now; counters of runs
        started and finished, retries, sweeper recoveries, fenced writes, cancelled steps,
        errors, poison steps, pauses, tokens and cost (US dollars); histograms of step
        durations, queue waits, model call latency and time to first token by model, tool
        durations by tool, run durations and the time to each decision by pause type
        (`orchestrator.store.metrics`); and the steps waiting in the broker's
        queues, where the dispatcher can say (None if it cannot, or the broker did not answer:
        logged). The same from any process on the same store."""
        snapshot = self.store.metrics()
        dispatcher = self.dispatcher
        if not isinstance(dispatcher, QueueLengths):
            return snapshot
        try:
            return replace(snapshot, queues=dispatcher.queue_lengths())
        except Exception as exc:
            log.warning("metrics: the broker's queue lengths could not be read (%s: %s)", type(exc).__name__, exc)
            return snapshot
