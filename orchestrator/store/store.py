"""The run store: every read and write of runs, messages and events, behind one interface.

`Store` holds what both databases share: the guarded moves, the fenced writes of a claimed step,
the outbox marker (`outbox.due_at`), and the reads and writes that are functions of a connection
(`reads.py`, `writes.py`). What differs between them (pools, how a new run, the claim and a step's
commit reach the database, how a waiting producer hears that a run stopped) is its backend's
(`backend.py`): `SqliteBackend` or `PostgresBackend`, chosen from the engine.

Writes that change a run go through `move` (`writes.move`): the status from `status.transition`,
applied as one guarded UPDATE (status, and the epoch when the caller holds one). Zero rows updated
means somebody else moved the run first: a no-op or a `FencedError`, never a clobber. Messages are
appended, never rewritten, each row stamped with the step and epoch that wrote it.

Every transaction is one of the store's named operations (`Store`'s, `Store.teams`' for a
team's members, `Store.requirements`' for a paused run's decisions, `Store.endings`' for a
cancel or a deadline that ends a run): no caller holds a connection. The store returns rows and
records; what a reader sees of them (run events, a timeline's steps) is derived above it, in
`orchestrator.events` and `orchestrator.timeline`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, insert, select
from sqlalchemy.exc import IntegrityError

from orchestrator.errors import FencedError
from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.state import StateChange
from orchestrator.status import RunStatus, transition
from orchestrator.store import history as session_history
from orchestrator.store import leases, metrics, reads, sessions, webhook_rows, writes
from orchestrator.store.backend import Backend
from orchestrator.store.backlog import Backlog
from orchestrator.store.catalog_rows import Catalog
from orchestrator.store.claims import Claim, held
from orchestrator.store.database import open_migrated
from orchestrator.store.definitions import RunDefinitions
from orchestrator.store.endings import Endings
from orchestrator.store.history import HistoryCache
from orchestrator.store.metrics import MetricsSnapshot
from orchestrator.store.notify import FinalWatcher
from orchestrator.store.outbox import due_at
from orchestrator.store.paused import Requirements
from orchestrator.store.postgres import PostgresBackend
from orchestrator.store.schedule_rows import Schedules
from orchestrator.store.sqlite import SqliteBackend
from orchestrator.store.stops import Stops
from orchestrator.store.tables import events, runs
from orchestrator.store.teams import Teams
from orchestrator.store.transcripts import TranscriptCache
from orchestrator.store.turns import Turns
from orchestrator.store.webhook_rows import WebhookOutbox

S = RunStatus
T = TypeVar("T")


class Store(reads.Reader):
    """The run store: its reads (`reads.Reader`) and its guarded writes. Thread-safe; one per
    process and URL."""

    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time) -> None:
        backend: Backend = PostgresBackend(engine) if engine.dialect.name == "postgresql" else SqliteBackend(engine)
        super().__init__(backend)
        self.engine = engine
        self.clock = clock
        #: Reads, and the claim on PostgreSQL.
        self.quick_engine = self._backend.quick_engine
        #: Writes that need not survive an OS crash: the claim and lease renewals (SQLite).
        self.lazy_engine = self._backend.lazy_engine
        #: Committed messages of the runs this process stepped: a claim reads only what is new.
        self.transcripts = TranscriptCache()
        #: Messages of the session histories this process's steps read (`history`).
        self.histories = HistoryCache()
        #: Team runs and their members: member starts and fan-ins (`store/teams.py`).
        self.teams = Teams(self, self._backend)
        #: What paused runs ask of a person, and the decisions (`store/paused.py`).
        self.requirements = Requirements(self, self._backend)
        #: The webhook outbox's deliveries (`webhook_rows`): what the sweeper sends and settles.
        self.webhooks = WebhookOutbox(self.engine)
        #: Runs cancelled, or ended by a pause's deadline or their own (`store/endings.py`).
        self.endings = Endings(self, self._backend)
        #: A claimed run's definition across a deploy: adopted, or its step handed on (`store/definitions.py`).
        self.definitions = RunDefinitions(self)
        #: Agents run on a cron schedule (`store/schedule_rows.py`, `orchestrator.schedules`).
        self.schedules = Schedules(engine)
        #: The agent catalog: what workers serve, written and read (`store/catalog_rows.py`).
        self.catalog = Catalog(self, self._backend)
        #: Who hears of each committed stop of a run (`store/stops.py`: the run's span).
        self.stops = Stops(engine)
        #: New runs written under bounds on the runs QUEUED (`store/backlog.py`).
        self.backlog = Backlog(self, self._backend)
        #: A serialized session's runs, one at a time: parks and turns (`store/turns.py`).
        self.turns = Turns(self, self._backend)

    @classmethod
    def open(cls, url: str, *, auto_migrate: bool = True, sqlite_synchronous: str = "FULL") -> Store:
        """The process's store for this URL (cached; opened migrated if asked, at `sqlite_synchronous`)."""
        with _cache_lock:
            store = _cache.get(url)
            if store is None:
                engine = open_migrated(url, auto_migrate=auto_migrate, sqlite_synchronous=sqlite_synchronous)
                store = _cache[url] = cls(engine)
            return store

    @property
    def display_url(self) -> str:
        """The database's URL with its password hidden: what a log may show."""
        return self.engine.url.render_as_string(hide_password=True)

    def final_watcher(self) -> FinalWatcher | None:
        """The process's listener for runs reaching a final status (PostgreSQL; None on SQLite)."""
        return self._backend.final_watcher()

    @property
    def announces_finals(self) -> bool:
        """Whether final moves are announced through `set_final_announcer` (SQLite), not by NOTIFY."""
        return self._backend.announces_finals

    def set_final_announcer(self, announce: Callable[[list[str]], None] | None) -> None:
        """Where this process announces the runs its committed transactions moved to a final
        status (`notify.announce_after_commit`); None: nowhere."""
        self._backend.announce = announce

    def dispose(self, *, close: bool = True) -> None:
        """Drop the pools and stop the listener of a store its opener owns (cached ones: `forget_stores`);
        `close=False`, after a fork, leaves the parent's pooled connections open."""
        self._backend.dispose(close=close)

    def metrics(self) -> MetricsSnapshot:
        """Runs by agent and status now, and the counters (`store/metrics.py`); first adds the
        rows settled since any process last asked to the stored totals."""
        with self.engine.begin() as conn:
            metrics.fold(conn, upto=self.clock() - metrics.SETTLE_SECONDS)
        return self._backend.snapshot(metrics.read)

    # ---------------------------------------------------------------- producer writes

    def create_run(
        self,
        *,
        run_id: str,
        session_id: str,
        agent_name: str,
        kind: str,
        input_messages: Sequence[Message],
        publish_grace: float,
        parent_run_id: str | None = None,
        forked_from: str | None = None,
        system_message: str | None = None,
        parent_tool_call_id: str | None = None,
        stream: bool = False,
        user_id: str | None = None,
        history: str | None = None,
        session_state: Mapping[str, Any] | None = None,
        priority: int | None = None,
        trace_context: str | None = None,
        request_digest: str | None = None,
        definition_hash: str | None = None,
        webhook: str | None = None,
        run_timeout: float | None = None,
        conn: Connection | None = None,
    ) -> RunRecord:
        """Write the run (QUEUED, first step a model call, published by the caller) and its
        input, atomically: on PostgreSQL in one statement (autocommitted unless `conn`, the
        caller's transaction, is given), on SQLite in one transaction. `session_state`: merged over
        the session's stored state, key by key, in the same transaction; `run_timeout`: see writes."""
        fields = dict(
            run_id=run_id,
            session_id=session_id,
            agent_name=agent_name,
            kind=kind,
            parent_run_id=parent_run_id,
            parent_tool_call_id=parent_tool_call_id,
            forked_from=forked_from,
            system_message=system_message,
            stream=stream,
            user_id=user_id,
            history=history,
            priority=priority,
            trace_context=trace_context,
            request_digest=request_digest,
            definition_hash=definition_hash,
            webhook=webhook,
            run_timeout=run_timeout,
        )
        values = writes.new_run(fields, now=self.clock(), n_messages=len(input_messages), publish_grace=publish_grace)
        changes = [StateChange(set=dict(session_state))] if session_state else []
        if conn is None and not changes:
            return self._backend.create_alone(values, input_messages)
        with nullcontext(conn) if conn is not None else self.engine.begin() as c:
            record = self._backend.create(c, values, input_messages)
            sessions.apply(c, record, changes)
            return record

    def log_event(self, conn: Connection, run_id: str, kind: str, seq: int | None, **detail: Any) -> None:
        """Record something that happened to a run (in the caller's transaction)."""
        text = json.dumps(detail, default=str) if detail else None
        conn.execute(insert(events).values(run_id=run_id, at=self.clock(), kind=kind, seq=seq, detail=text))

    def record_fenced(self, claim: Claim) -> None:
        """Log, in a transaction of its own, that the claimed step was fenced: another holder
        owns the run now, so nothing else of the step is written (a worker that came back late)."""
        held = claim.record
        with self.engine.begin() as conn:
            # A run cancelled while the step ran fenced it too: said apart (`cause`), so that the
            # metrics count that as a cancelled step, not as a worker that came back too late.
            now = conn.execute(select(runs.c.status).where(runs.c.run_id == held.run_id)).scalar_one_or_none()
            cause = {"cause": "cancel"} if now == S.CANCELLED.value else {}
            self.log_event(conn, held.run_id, "fenced", held.seq, epoch=held.epoch, owner=held.lease_owner, **cause)

    # ---------------------------------------------------------------- the guarded move

    def move(
        self,
        run_id: str,
        *,
        src: Iterable[RunStatus],
        dst: RunStatus,
        epoch: int | None = None,
        bump_epoch: bool = False,
        event: str | None = None,
        new_messages: Sequence[Message] = (),
        publish_grace: float | None = None,
        delay: float = 0.0,
        conn: Connection | None = None,
        extra_where: Any = None,
        **values: Any,
    ) -> RunRecord | None:
        """Apply `src -> dst` if the run is in one of `src` (and at `epoch`), setting `values`;
        the new row, or None if the guard did not match. In its own transaction unless `conn`
        (the caller's) is given. When it moves, it appends `new_messages` (stamped with the seq
        and epoch it leaves the run at) and logs `event`. A move to QUEUED sets the outbox
        marker: `publish_grace` when the caller publishes the step after the move, None when the
        sweeper is to; `delay`: not before then (see `outbox`)."""
        if new_messages:
            values["n_messages"] = runs.c.n_messages + len(new_messages)
        with nullcontext(conn) if conn is not None else self.engine.begin() as c:
            record = writes.move(
                c,
                run_id,
                src=src,
                dst=dst,
                now=self.clock(),
                epoch=epoch,
                bump_epoch=bump_epoch,
                extra_where=extra_where,
                publish_grace=publish_grace,
                delay=delay,
                values=values,
            )
            if record is None:
                return None
            start = record.n_messages - len(new_messages)
            writes.insert_messages(
                c, run_id, start, new_messages, record.updated_at, seq=record.seq, epoch=record.epoch
            )
            if event:
                self.log_event(c, run_id, event, record.seq, to=dst.value, **writes.position(record))
            if dst.is_final:
                self._backend.on_final(c, run_id)
                webhook_rows.enqueue(c, record)
                self.stops.note(c, record)
            return record

    def mark_due(self, run_id: str, *, epoch: int, publish_grace: float | None = None) -> bool:
        """Set a QUEUED run's outbox marker again (not a move): `publish_grace` when the caller
        publishes its step now, None when it could not (the next sweep publishes it)."""
        with self.engine.begin() as conn:
            return writes.mark_due(conn, run_id, epoch=epoch, now=self.clock(), publish_grace=publish_grace)

    # ---------------------------------------------------------------- worker writes

    def claim(
        self, run_id: str, seq: int, kind: str, *, owner: str, lease_seconds: float, max_attempts: int
    ) -> Claim | None:
        """Take the run for step (seq, kind): bump the epoch, set the lease. None if stale or busy.

        A step claimed `max_attempts` times is not claimed again, even once its lease expired: a
        redelivery must not bypass the sweeper's poison check. A lazy write: lost in a crash, the
        run is as it was, the step's commit (fenced by epoch and owner) fails, the sweeper republishes."""
        now = self.clock()
        params = dict(
            b_run_id=run_id,
            b_now=now,
            b_seq=seq,
            b_kind=kind,
            b_owner=owner[:255],
            b_expires=now + lease_seconds,
            b_cap=max_attempts,
        )
        return self._backend.lazy(lambda conn: self._backend.claim(conn, params, self.transcripts))

    def commit_step(
        self,
        claim: Claim,
        new_messages: Sequence[Message],
        *,
        status: RunStatus,
        next_step: str | None,
        publish_grace: float,
        content: str | None = None,
        system_message: str | None = None,
        state_changes: Sequence[StateChange] = (),
        conn: Connection | None = None,
    ) -> RunRecord:
        """Append the step's messages and move the run on, fenced by the epoch, atomically. A
        step left QUEUED is published by the caller (`publish_grace`: see `outbox`).
        `state_changes`: what the tool calls whose results these are changed in the session's
        state, applied in the same transaction.

        Without `conn` it is its own write (on PostgreSQL one autocommitted statement, unless it
        changes the state) and the messages go into this process's transcript cache. With
        `conn`, the caller's transaction carries it and the caller calls `remember` once that
        committed."""
        if conn is None:
            with self.engine.begin() if state_changes else self._backend.single_statement() as c:
                committed = self.commit_step(
                    claim,
                    new_messages,
                    status=status,
                    next_step=next_step,
                    publish_grace=publish_grace,
                    content=content,
                    system_message=system_message,
                    state_changes=state_changes,
                    conn=c,
                )
            self.remember(committed, new_messages)
            return committed
        now = self.clock()
        params = _commit_params(claim, status, now, publish_grace, len(new_messages))
        params.update(b_next=next_step, b_content=content, b_system=system_message)
        record = self._backend.commit(conn, params, new_messages, seq=claim.record.seq, final=status.is_final)
        if record is None:
            raise FencedError(
                f"run {claim.run_id}: the lease of epoch {claim.epoch} expired or was taken over; commit dropped"
            )
        sessions.apply(conn, record, state_changes)
        self.stops.note(conn, record)
        return record

    def append_tool_result(self, claim: Claim, message: Message, change: StateChange | None = None) -> None:
        """Commit one finished tool call's result now, so a crash later never re-runs it, with
        what the call changed in the session's state (`change`), in one transaction."""
        now = self.clock()
        with self.engine.begin() as conn:
            count = writes.count_tool_result(conn, claim, now)
            if count is None:
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost; tool result not recorded")
            seq, stamp = claim.record.seq, claim.definition_hash
            writes.insert_messages(
                conn, claim.run_id, count - 1, [message], now, seq=seq, epoch=claim.epoch, definition_hash=stamp
            )
            sessions.apply(conn, claim.record, [change] if change is not None else [])
        self.transcripts.extend(claim.run_id, count - 1, [message])

    def add_state_defaults(self, run: RunRecord, defaults: Mapping[str, Any]) -> None:
        """Add the keys of `run`'s agent's default `session_state` that its session's state lacks."""
        with self.engine.begin() as conn:
            sessions.add_defaults(conn, run, defaults)

    def step_landed(self, claim: Claim) -> RunRecord | None:
        """After a write of the claimed step failed on a transient error: the run if that write
        committed after all (the run moved on from the claim's seq at the claim's epoch), None if
        the claim still holds and nothing landed; FencedError if somebody else took the run."""
        record = self.get_record(claim.run_id)
        if record.epoch == claim.epoch and record.seq > claim.record.seq:
            # What this process cached for the run may now be short or long by the step: re-read.
            self.transcripts.forget(claim.run_id)
            return record
        if record.status == S.RUNNING and (record.epoch, record.lease_owner) == (claim.epoch, claim.record.lease_owner):
            return None
        raise FencedError(f"run {claim.run_id}: the claim of epoch {claim.epoch} was taken over during a retried write")

    def history(self, claim: Claim, num_runs: int, *, in_turn: bool = False) -> list[Message]:
        """The messages of the claimed run's session history (`orchestrator.store.history`): on
        its first step chosen from the last `num_runs` runs and stored, fenced by the claim (a
        lazy write: lost in a crash only with the claim, whose step then commits nothing); on
        every later one, as stored. `in_turn`: of a serialized session (every run that completed
        before its turn). FencedError if the claim was lost."""
        return session_history.for_claim(self._backend, self.histories, claim, num_runs, self.clock(), in_turn)

    def set_kind(self, claim: Claim, kind: str) -> None:
        """Record what the run is (agent or team) as the worker, which imports it, knows it: a
        producer that does not cannot tell; reads look for member runs only under teams."""
        with self.engine.begin() as conn:
            writes.set_kind(conn, claim, kind)

    def renew_leases(self, held: Sequence[tuple[str, int, str]], *, lease_seconds: float) -> set[str]:
        """The heartbeat: extend the leases of the steps `held` as (run_id, epoch, owner), in one
        lazy UPDATE, to now + `lease_seconds`. Returns the owners renewed; a step not among them
        is lost to its holder (fenced, cancelled, finished, or its lease already expired)."""
        if not held:
            return set()
        now = self.clock()
        return self._backend.lazy(lambda conn: writes.renew_leases(conn, held, now=now, lease_seconds=lease_seconds))

    def hold_lease(self, name: str, owner: str, *, seconds: float) -> bool:
        """Take or renew the fleet-wide lease `name` for `owner` for `seconds` (`store/leases.py`),
        if it is free or theirs already; whether they hold it now. `seconds=0`: let it go, if
        theirs. A lazy write: lost in an OS crash, the lease just expires sooner."""
        now = self.clock()
        if seconds <= 0:
            self._backend.lazy(lambda conn: leases.release(conn, name, owner, now=now))
            return False
        try:
            return self._backend.lazy(lambda conn: leases.take(conn, name, owner, now=now, seconds=seconds))
        except IntegrityError:  # another process inserted its first row at the same moment
            return False

    def lease(self, name: str) -> leases.Lease | None:
        """The lease `name` as stored: who holds (or last held) it, until when, last renewed when."""
        return self._backend.quick(lambda conn: leases.read(conn, name))

    def remember(self, record: RunRecord, new_messages: Sequence[Message]) -> None:
        """After a commit: keep its messages in this process's transcript cache (not a final run's)."""
        if record.status.is_final:
            self.transcripts.forget(record.run_id)
        else:
            self.transcripts.extend(record.run_id, record.n_messages - len(new_messages), new_messages)

    def record_tool_start(self, claim: Claim, tool_call_id: str, tool_name: str) -> None:
        """Mark an at-most-once call as started, before it runs (fenced by the epoch and the lease)."""
        with self.engine.begin() as conn:
            if not writes.record_tool_start(conn, claim, tool_call_id, tool_name, self.clock()):
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before {tool_name} started")

    def park_for_retry(
        self, claim: Claim, *, delay: float, published: bool, error: dict[str, str], publish_grace: float
    ) -> RunRecord:
        """Put the step back in the queue after a transient failure, to run again after `delay`.
        `published`: the caller publishes it with a countdown; if not (a long wait), the sweeper
        does when it is due, so no worker is held and no countdown outlives the visibility
        timeout. The retry gets the next seq, so a stray copy of the failed attempt's task (a
        republish, a redelivery) is stale and cannot call the model again before the backoff."""
        counts = dict(seq=runs.c.seq + 1, retries=runs.c.retries + 1, attempts=0)
        return self._park(claim, "retry", delay, published, publish_grace, counts, error=error)

    def park_throttled(
        self, claim: Claim, *, delay: float, published: bool, reason: str, publish_grace: float
    ) -> RunRecord:
        """Put the step back in the queue, not run, because a limit said wait (`orchestrator.limits`):
        not a retry, and its claim does not count toward the poison limit. It keeps its seq: a
        stray copy of its task only asks the limiter again. `published` as for a retry."""
        counts = dict(attempts=runs.c.attempts - 1)
        return self._park(claim, "throttled", delay, published, publish_grace, counts, reason=reason)

    def fall_back(self, claim: Claim, *, index: int, lease_seconds: float, **why: Any) -> RunRecord:
        """Move the claimed model step on to the model at `index` of its agent's fallback chain,
        before the worker calls it: the same step (same seq, still RUNNING, the lease renewed),
        its retries counted again for that model, under a new epoch so that the live events of
        the call that failed sort before those of the next; logged as "fallback" with `why`
        (the models, the error) at the epoch of the call that failed. A worker that dies in the
        next call leaves `model_index` for the step taken back. FencedError if the claim was lost."""
        now = self.clock()
        with self.engine.begin() as conn:
            record = self.move(
                claim.run_id,
                src=(S.RUNNING,),
                dst=S.RUNNING,
                epoch=claim.epoch,
                bump_epoch=True,
                extra_where=held(claim, now),
                conn=conn,
                model_index=index,
                retries=0,
                lease_expires_at=now + lease_seconds,
            )
            if record is None:
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before its fallback")
            detail = {"index": index, **why, "n_messages": record.n_messages, "epoch": claim.epoch}
            self.log_event(conn, claim.run_id, "fallback", record.seq, **detail)
            return record

    def _park(
        self,
        claim: Claim,
        event: str,
        delay: float,
        published: bool,
        publish_grace: float,
        counts: dict[str, Any],
        **why: Any,
    ) -> RunRecord:
        """Move the claimed run RUNNING -> QUEUED (with `counts`: its seq, retries, attempts), its
        outbox marker due after `delay` (and `publish_grace` more when the caller publishes it),
        and log `event` with `why`; FencedError if the claim was lost."""
        now = self.clock()
        with self.engine.begin() as conn:
            record = self.move(
                claim.run_id,
                src=(S.RUNNING,),
                dst=S.QUEUED,
                epoch=claim.epoch,
                extra_where=held(claim, now),
                publish_grace=publish_grace if published else None,
                delay=delay,
                conn=conn,
                lease_owner=None,
                lease_expires_at=None,
                **counts,
            )
            if record is None:
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before the step was parked")
            where = dict(by="countdown" if published else "sweeper", **writes.position(record))
            self.log_event(conn, claim.run_id, event, record.seq, delay=round(delay, 3), **why, **where)
            return record

    def fail(
        self,
        run_id: str,
        *,
        epoch: int | None,
        error: dict[str, str],
        inflight: Sequence[Message] = (),
        system_message: str | None = None,
        owner: str | None = None,
        state_changes: Sequence[StateChange] = (),
        definition_hash: str | None = None,
    ) -> RunRecord | None:
        """Put the run in ERROR, flushing the in-flight messages after the committed ones (the
        move keeps the step's seq and epoch, so they are stamped with the failed step's), and
        applying `state_changes`, what the tool calls whose results are among them changed.
        `definition_hash`: the failed step's worker's definition, logged with the error.

        Committed messages are never touched; a system message already stored is kept. Fenced by
        the epoch when given, and by the claim's owner when given (on PostgreSQL a claim lost in
        a crash can have its epoch number reused by the next claim; see `claims.held`): a stale
        failure handler changes nothing (returns None)."""
        values = writes.error_values(error, system_message)
        with self.engine.begin() as conn:
            record = self.move(
                run_id,
                src=(S.RUNNING,),
                dst=S.ERROR,
                epoch=epoch,
                new_messages=inflight,
                conn=conn,
                extra_where=None if owner is None else runs.c.lease_owner == owner,
                **values,
            )
            if record is not None:
                self.log_event(
                    conn,
                    run_id,
                    "error",
                    record.seq,
                    type=values["error_type"],
                    message=values["error_message"],
                    **writes.position(record),
                    **({"definition_hash": definition_hash} if definition_hash else {}),
                )
                sessions.apply(conn, record, state_changes)
            return record


_cache_lock = threading.Lock()
_cache: dict[str, Store] = {}


def _commit_params(claim: Claim, status: RunStatus, now: float, publish_grace: float, count: int) -> dict[str, Any]:
    """What a step's commit binds of its claim and the move it makes (the rest: its contents)."""
    return dict(
        b_run_id=claim.run_id,
        b_epoch=claim.epoch,
        b_owner=claim.record.lease_owner,
        b_now=now,
        b_status=transition((S.RUNNING,), status),
        b_count=count,
        b_publish_after=due_at(status, now, publish_grace=publish_grace),
        b_started=claim.record.updated_at,
        b_queued=claim.record.queued_at,
        b_definition=claim.definition_hash,
    )


def forget_stores() -> None:
    """Drop cached stores (after a fork, or between tests that change RATCHET_DATABASE_URL)."""
    with _cache_lock:
        for store in _cache.values():
            store.dispose(close=False)
        _cache.clear()
