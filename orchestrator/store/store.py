"""The run store: every read and write of runs, messages and events.

Writes that change a run go through `_move`, which checks the move against
`status.TRANSITIONS` and applies it as one guarded UPDATE (status, and the epoch when the caller
holds one). Zero rows updated means somebody else moved the run first: the caller's write is a
no-op or a `FencedError`, never a clobber. Messages are appended, never rewritten.
The reads are in `reads.py` (`StoreReads`, a base of `Store`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, select, tuple_, update

from orchestrator.errors import ConfigurationError, FencedError
from orchestrator.messages import Message
from orchestrator.run import RunRecord
from orchestrator.status import RunStatus, can_move
from orchestrator.store import statements
from orchestrator.store.database import (
    autocommit_is_read_committed,
    is_migrated,
    migrate,
    open_engine,
    open_lazy_engine,
    open_quick_engine,
)
from orchestrator.store.notify import FinalWatcher, notify_final
from orchestrator.store.reads import StoreReads
from orchestrator.store.schema import events, messages, runs, tool_starts
from orchestrator.store.transcripts import Transcript, TranscriptCache
from orchestrator.untrusted import ERROR_MESSAGE_MAX, ERROR_TYPE_MAX, clip

S = RunStatus


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A claimed step: the run as the claim left it, and its stored messages."""

    record: RunRecord
    transcript: Transcript

    @property
    def messages(self) -> list[Message]:
        return self.transcript.messages

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def epoch(self) -> int:
        return self.record.epoch


class Store(StoreReads):
    """Reads and guarded writes of the run store. Thread-safe; one per process and URL."""

    def __init__(self, engine: Engine, *, clock: Callable[[], float] = time.time) -> None:
        self.engine = engine
        self.clock = clock
        self._is_pg = engine.dialect.name == "postgresql"
        #: PostgreSQL: single statements (the claim, a step's commit, a new run, reads) are sent
        #: autocommitted, unless the database's default isolation is stricter than READ COMMITTED.
        self._autocommit = self._is_pg and autocommit_is_read_committed(engine)
        #: Reads, and the claim on PostgreSQL (see `open_quick_engine`).
        self.quick_engine = open_quick_engine(engine, autocommit=self._autocommit)
        #: Writes that need not survive an OS crash: the claim and lease renewals (SQLite).
        self.lazy_engine = open_lazy_engine(engine)
        #: Committed messages of the runs this process stepped: a claim reads only what is new.
        self.transcripts = TranscriptCache()
        self._watcher: FinalWatcher | None = None
        self._watcher_lock = threading.Lock()

    def final_watcher(self) -> FinalWatcher | None:
        """The process's listener for runs reaching a final status (PostgreSQL; None on SQLite)."""
        if not self._is_pg:
            return None
        with self._watcher_lock:
            if self._watcher is None:
                dsn = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
                self._watcher = FinalWatcher(dsn)
            return self._watcher

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, url: str, *, auto_migrate: bool = True, sqlite_synchronous: str = "FULL") -> Store:
        """The process's store for this URL (cached), migrated first when asked.
        `sqlite_synchronous`: RATCHET_SQLITE_SYNCHRONOUS, applied by the call that opens it."""
        with _cache_lock:
            store = _cache.get(url)
            if store is None:
                engine = open_engine(url, sqlite_synchronous=sqlite_synchronous)
                if auto_migrate:
                    migrate(engine)
                elif not is_migrated(engine):
                    raise ConfigurationError(
                        f"the database has no Ratchet tables; run `ratchet migrate` first ({engine.url!r})"
                    )
                store = _cache[url] = cls(engine)
            return store

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
        conn: Connection | None = None,
    ) -> RunRecord:
        """Write the run (QUEUED, first step a model call) and its input, atomically: on
        PostgreSQL in one statement (autocommitted unless `conn`, the caller's transaction, is
        given), on SQLite in one transaction."""
        if conn is None:
            with self.engine.connect() as c:
                if self._autocommit:
                    c = c.execution_options(isolation_level="AUTOCOMMIT")
                with c.begin():
                    return self.create_run(
                        run_id=run_id, session_id=session_id, agent_name=agent_name, kind=kind,
                        input_messages=input_messages, publish_grace=publish_grace, parent_run_id=parent_run_id,
                        forked_from=forked_from, system_message=system_message,
                        parent_tool_call_id=parent_tool_call_id, conn=c,
                    )  # fmt: skip
        now = self.clock()
        values: dict[str, Any] = dict(
            run_id=run_id, session_id=session_id, agent_name=agent_name, kind=kind,
            parent_run_id=parent_run_id, parent_tool_call_id=parent_tool_call_id, forked_from=forked_from,
            status=S.QUEUED.value, epoch=0, seq=0,
            next_step="model", n_messages=len(input_messages), system_message=system_message, lease_owner=None,
            lease_expires_at=None, attempts=0, retries=0, publish_after=now + publish_grace, content=None,
            error_type=None, error_message=None, created_at=now, updated_at=now,
        )  # fmt: skip
        if self._is_pg:
            params = {f"b_r_{k}": v for k, v in values.items()}
            params.update(b_session_id=session_id, b_now=now, **statements.message_arrays(input_messages))
            return RunRecord.from_row(conn.execute(statements.CREATE_PG, params).one())
        self._ensure_session(conn, session_id, now)
        row = conn.execute(statements.CREATE_RUN, values).one()
        self._insert_messages(conn, run_id, 0, input_messages, now)
        return RunRecord.from_row(row)

    def _ensure_session(self, conn: Connection, session_id: str, now: float) -> None:
        """SQLite (PostgreSQL does this inside `statements.CREATE_PG`)."""
        conn.execute(statements.CREATE_SESSION, {"session_id": session_id, "created_at": now})

    def _insert_messages(self, conn: Connection, run_id: str, start: int, items: Sequence[Message], now: float) -> None:
        if items:
            conn.execute(
                insert(messages),
                [{**m.to_row(), "run_id": run_id, "idx": start + i, "created_at": now} for i, m in enumerate(items)],
            )

    def log_event(self, conn: Connection, run_id: str, kind: str, seq: int | None, **detail: Any) -> None:
        """Record something that happened to a run (in the caller's transaction)."""
        conn.execute(
            insert(events).values(
                run_id=run_id,
                at=self.clock(),
                kind=kind,
                seq=seq,
                detail=json.dumps(detail, default=str) if detail else None,
            )
        )

    # ---------------------------------------------------------------- the guarded move

    def _move(
        self,
        conn: Connection,
        run_id: str,
        *,
        src: Iterable[RunStatus],
        dst: RunStatus,
        epoch: int | None = None,
        bump_epoch: bool = False,
        extra_where: Any = None,
        **values: Any,
    ) -> RunRecord | None:
        """Apply `src -> dst` if the run is in one of `src` (and at `epoch`); the new row or None."""
        src = tuple(src)
        for s in src:
            if not can_move(s, dst):
                raise ValueError(f"illegal run transition {s} -> {dst}")  # a bug in Ratchet, not in input
        where = [runs.c.run_id == run_id, runs.c.status.in_([s.value for s in src])]
        if epoch is not None:
            where.append(runs.c.epoch == epoch)
        if extra_where is not None:
            where.append(extra_where)
        values["status"] = dst.value
        values["updated_at"] = self.clock()
        if bump_epoch:
            values["epoch"] = runs.c.epoch + 1
        row = conn.execute(update(runs).where(*where).values(**values).returning(*runs.c)).first()
        if row is None:
            return None
        if self._is_pg and dst.is_final:
            notify_final(conn, run_id)
        return RunRecord.from_row(row)

    # ---------------------------------------------------------------- worker writes

    def claim(
        self, run_id: str, seq: int, kind: str, *, owner: str, lease_seconds: float, max_attempts: int | None = None
    ) -> Claim | None:
        """Take the run for step (seq, kind): bump the epoch, set the lease. None if stale or busy.

        A step already claimed `max_attempts` times is not claimed again, even once its lease
        expired: a redelivered message must not bypass the sweeper's poison check."""
        now = self.clock()
        params = dict(
            b_run_id=run_id, b_now=now, b_seq=seq, b_kind=kind, b_owner=owner[:255],
            b_expires=now + lease_seconds, b_cap=statements.NO_CAP if max_attempts is None else max_attempts,
        )  # fmt: skip

        def claim(conn: Connection) -> Claim | None:
            row = conn.execute(statements.CLAIM, params).first()
            if row is None:
                return None
            record = RunRecord.from_row(row)
            return Claim(record=record, transcript=self._transcript(conn, record))

        def claim_pg(conn: Connection) -> Claim | None:
            # The claim and the messages this process has not cached yet, in one round trip.
            known = self.transcripts.known(run_id)
            row = conn.execute(statements.CLAIM_PG, {**params, "b_since": len(known)}).first()
            if row is None:
                return None
            record = RunRecord.from_row(row)
            tail = statements.messages_from_json(row.messages_json)
            return Claim(record=record, transcript=self._transcript(conn, record, known=known, tail=tail))

        if self._is_pg:
            # One autocommitted UPDATE that does not wait for its WAL flush: if the database
            # crashes and loses it, the run is back as it was, the step's commit (fenced by this
            # claim's epoch and owner) fails, and the sweeper republishes. A synchronous commit
            # that follows (the step's, or an at-most-once tool's start) flushes the WAL in order,
            # claim first. If a dropped connection hid a claim that did commit, the retry finds the
            # run RUNNING and drops the delivery; the sweeper takes the run back when the lease ends.
            return self._quick(claim_pg)
        with self.lazy_engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE, committed without its fsync
            return claim(conn)

    def _transcript(
        self,
        conn: Connection,
        record: RunRecord,
        *,
        known: Transcript | None = None,
        tail: list[Message] | None = None,
    ) -> Transcript:
        """The run's committed messages: the cached prefix plus the rows after it.

        `known` and `tail`: a cached prefix and the rows after it, already read with the record
        (used when they add up to the record's count; else read again). Committed messages are
        never rewritten and the row counts them, so a prefix read earlier stays valid."""
        if known is not None and tail is not None and len(known) + len(tail) == record.n_messages:
            self.transcripts.extend(record.run_id, len(known), tail)
            known.append(tail)
            return known
        known = self.transcripts.known(record.run_id)
        if len(known) > record.n_messages:  # cannot happen to committed rows; trust the store
            self.transcripts.forget(record.run_id)
            known = Transcript()
        if len(known) < record.n_messages:
            rows = conn.execute(statements.MESSAGES, {"b_run_id": record.run_id, "b_since": len(known)})
            tail = [Message.from_row(r) for r in rows][: record.n_messages - len(known)]
            self.transcripts.extend(record.run_id, len(known), tail)
            known.append(tail)
        return known

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
        conn: Connection | None = None,
    ) -> RunRecord:
        """Append the step's messages and move the run on, fenced by the epoch, atomically.

        Without `conn` it is its own write (on PostgreSQL one autocommitted statement) and the
        messages go into this process's transcript cache. With `conn`, the caller's transaction
        carries it and the caller calls `remember` once that committed."""
        if not can_move(S.RUNNING, status):
            raise ValueError(f"illegal run transition {S.RUNNING} -> {status}")  # a bug in Ratchet, not in input
        if conn is None:
            with self.engine.connect() as c:
                if self._autocommit:  # one statement: no BEGIN and COMMIT round trips around it
                    c = c.execution_options(isolation_level="AUTOCOMMIT")
                with c.begin():
                    committed = self.commit_step(
                        claim, new_messages, status=status, next_step=next_step, publish_grace=publish_grace,
                        content=content, system_message=system_message, conn=c,
                    )  # fmt: skip
            self.remember(committed, new_messages)
            return committed
        now = self.clock()
        params: dict[str, Any] = dict(
            b_run_id=claim.run_id, b_epoch=claim.epoch, b_owner=claim.record.lease_owner, b_now=now,
            b_status=status.value, b_next=next_step,
            b_count=len(new_messages), b_publish_after=now + publish_grace if status == S.QUEUED else None,
            b_content=content, b_system=system_message,
        )  # fmt: skip
        if self._is_pg:
            statement = statements.COMMIT_PG_FINAL if status.is_final else statements.COMMIT_PG
            row = conn.execute(statement, {**params, **statements.message_arrays(new_messages)}).first()
        else:
            row = conn.execute(statements.COMMIT, params).first()
        if row is None:
            raise FencedError(
                f"run {claim.run_id}: the lease of epoch {claim.epoch} expired or was taken over; commit dropped"
            )
        record = RunRecord.from_row(row)
        if not self._is_pg:
            self._insert_messages(conn, claim.run_id, record.n_messages - len(new_messages), new_messages, now)
        return record

    def append_tool_result(self, claim: Claim, message: Message) -> None:
        """Commit one finished tool call's result now, so a crash later never re-runs it."""
        now = self.clock()
        with self.engine.begin() as conn:
            row = conn.execute(
                update(runs)
                .where(
                    runs.c.run_id == claim.run_id,
                    runs.c.epoch == claim.epoch,
                    runs.c.status == S.RUNNING.value,
                    _held(claim, now),
                )
                .values(n_messages=runs.c.n_messages + 1, updated_at=now)
                .returning(runs.c.n_messages)
            ).first()
            if row is None:
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost; tool result not recorded")
            self._insert_messages(conn, claim.run_id, row.n_messages - 1, [message], now)
        self.transcripts.extend(claim.run_id, row.n_messages - 1, [message])

    def step_landed(self, claim: Claim) -> RunRecord | None:
        """After a write of the claimed step failed on a transient error: the run if that write
        committed after all (the run moved on from the claim's seq at the claim's epoch), None if
        the claim still holds and nothing landed; FencedError if somebody else took the run."""
        record = self.get_record(claim.run_id)
        if record.epoch == claim.epoch and record.seq > claim.record.seq:
            # What this process cached for the run may now be short or long by the step: re-read.
            self.transcripts.forget(claim.run_id)
            return record
        if (
            record.status == S.RUNNING
            and record.epoch == claim.epoch
            and record.lease_owner == claim.record.lease_owner
        ):
            return None
        raise FencedError(f"run {claim.run_id}: the claim of epoch {claim.epoch} was taken over during a retried write")

    def has_tool_result(self, run_id: str, tool_call_id: str) -> bool:
        """Whether a result of this tool call is stored (a retried append looks before writing)."""
        query = select(messages.c.idx).where(messages.c.run_id == run_id, messages.c.tool_call_id == tool_call_id)
        return self._quick(lambda conn: conn.execute(query).first() is not None)

    def set_kind(self, claim: Claim, kind: str) -> None:
        """Record what the run is (agent or team) as the worker, which imports it, knows it.

        A producer that does not import the agents (`Client().start`, `ratchet run` without
        `--app`) cannot tell a team from an agent; reads look for member runs only under teams."""
        with self.engine.begin() as conn:
            conn.execute(
                update(runs)
                .where(
                    runs.c.run_id == claim.run_id,
                    runs.c.epoch == claim.epoch,
                    runs.c.lease_owner == claim.record.lease_owner,
                )
                .values(kind=kind)
            )

    def renew_leases(self, held: Sequence[tuple[str, int, str]], *, lease_seconds: float) -> set[str]:
        """The heartbeat: extend the leases of the steps `held` as (run_id, epoch, owner), in one
        UPDATE, to now + `lease_seconds`. Returns the owners renewed; a step not among them is
        lost to its holder (fenced, cancelled, finished, or its lease already expired).

        Guarded as every write of a step is (`_held`): an expired lease is not revived, because
        the sweeper may be taking the run back at this very moment."""
        if not held:
            return set()
        now = self.clock()
        statement = (
            update(runs)
            .where(
                runs.c.status == S.RUNNING.value,
                runs.c.lease_expires_at > now,
                tuple_(runs.c.run_id, runs.c.epoch, runs.c.lease_owner).in_(list(held)),
            )
            .values(lease_expires_at=now + lease_seconds)
            .returning(runs.c.lease_owner)
        )
        if self._is_pg:
            return self._quick(lambda conn: {r.lease_owner for r in conn.execute(statement)})
        with self.lazy_engine.begin() as conn:  # SQLite: BEGIN IMMEDIATE, committed without its fsync
            return {r.lease_owner for r in conn.execute(statement)}

    def remember(self, record: RunRecord, new_messages: Sequence[Message]) -> None:
        """After a commit: keep its messages in this process's transcript cache (a final run is
        dropped from it)."""
        if record.status.is_final:
            self.transcripts.forget(record.run_id)
        else:
            self.transcripts.extend(record.run_id, record.n_messages - len(new_messages), new_messages)

    def record_tool_start(self, claim: Claim, tool_call_id: str, tool_name: str) -> None:
        """Mark an at-most-once call as started, before it runs (fenced by the epoch and the lease)."""
        now = self.clock()
        with self.engine.begin() as conn:
            held = conn.execute(
                select(runs.c.run_id)
                .where(
                    runs.c.run_id == claim.run_id,
                    runs.c.epoch == claim.epoch,
                    runs.c.status == S.RUNNING.value,
                    _held(claim, now),
                )
                # Locked until the start row commits, so no claim can take the run in between and
                # miss the start (SQLite: BEGIN IMMEDIATE already serialises the two).
                .with_for_update()
            ).first()
            if held is None:
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before {tool_name} started")
            conn.execute(
                insert(tool_starts).values(
                    run_id=claim.run_id, tool_call_id=tool_call_id, tool_name=tool_name,
                    epoch=claim.epoch, started_at=self.clock(),
                )
            )  # fmt: skip

    def park_for_retry(
        self, claim: Claim, *, delay: float, published: bool, error: dict[str, str], publish_grace: float
    ) -> RunRecord:
        """Put the step back in the queue after a transient failure, to run again after `delay`.

        `published` says whether the caller publishes it with a countdown; if not (a long wait),
        the sweeper publishes it when it is due, so no worker is held and no countdown outlives
        the broker's visibility timeout. The retry gets the next seq: a copy of the failed
        attempt's task still about (a sweeper republish, a redelivery) is then stale, and cannot
        call the model again before the backoff (Retry-After) is over."""
        now = self.clock()
        with self.engine.begin() as conn:
            record = self._move(
                conn, claim.run_id, src=(S.RUNNING,), dst=S.QUEUED, epoch=claim.epoch, extra_where=_held(claim, now),
                seq=runs.c.seq + 1, retries=runs.c.retries + 1, attempts=0, lease_owner=None, lease_expires_at=None,
                publish_after=now + delay + (publish_grace if published else 0.0),
            )  # fmt: skip
            if record is None:
                raise FencedError(f"run {claim.run_id}: lease of epoch {claim.epoch} lost before the retry was parked")
            self.log_event(
                conn, claim.run_id, "retry", record.seq, delay=round(delay, 3), error=error,
                by="countdown" if published else "sweeper",
            )  # fmt: skip
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
    ) -> RunRecord | None:
        """Put the run in ERROR, flushing the in-flight messages after the committed ones.

        Committed messages are never touched; a system message already stored is kept. Fenced by
        the epoch when given, and by the claim's owner when given (on PostgreSQL a claim lost in
        a crash can have its epoch number reused by the next claim; see `_held`): a stale failure
        handler changes nothing (returns None)."""
        values: dict[str, Any] = dict(
            error_type=clip(error.get("type", "Error"), ERROR_TYPE_MAX),
            error_message=clip(error.get("message", ""), ERROR_MESSAGE_MAX),
            lease_owner=None, lease_expires_at=None, publish_after=None,
        )  # fmt: skip
        if system_message is not None:
            values["system_message"] = func.coalesce(runs.c.system_message, system_message)
        with self.engine.begin() as conn:
            record = self.move(
                run_id, src=(S.RUNNING,), dst=S.ERROR, epoch=epoch, new_messages=inflight, conn=conn,
                extra_where=None if owner is None else runs.c.lease_owner == owner, **values,
            )  # fmt: skip
            if record is not None:
                self.log_event(
                    conn, run_id, "error", record.seq, type=values["error_type"], message=values["error_message"]
                )
            return record

    # ---------------------------------------------------------------- control

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
        conn: Connection | None = None,
        extra_where: Any = None,
        **values: Any,
    ) -> RunRecord | None:
        """A guarded move, appending `new_messages` when it succeeds; in its own transaction
        unless `conn` (the caller's transaction) is given."""
        if conn is None:
            with self.engine.begin() as c:
                return self.move(
                    run_id, src=src, dst=dst, epoch=epoch, bump_epoch=bump_epoch, event=event,
                    new_messages=new_messages, conn=c, extra_where=extra_where, **values,
                )  # fmt: skip
        now = self.clock()
        if new_messages:
            values["n_messages"] = runs.c.n_messages + len(new_messages)
        record = self._move(
            conn, run_id, src=src, dst=dst, epoch=epoch, bump_epoch=bump_epoch, extra_where=extra_where, **values
        )
        if record is not None:
            self._insert_messages(conn, run_id, record.n_messages - len(new_messages), new_messages, now)
            if event:
                self.log_event(conn, run_id, event, record.seq, to=dst.value)
        return record

    def mark_due(self, run_id: str, *, epoch: int, when: float | None = None) -> bool:
        """Set when the sweeper should (re)publish a QUEUED run's step (default: now). Not a move."""
        with self.engine.begin() as conn:
            result = conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id, runs.c.epoch == epoch, runs.c.status == S.QUEUED.value)
                .values(publish_after=self.clock() if when is None else when)
            )
            return bool(result.rowcount)


def _held(claim: Claim, now: float) -> Any:
    """A worker's write needs its lease live and its own, not only its epoch.

    Live: once the lease expired the sweeper may be re-queueing the run at this very moment, so
    the worker is no longer its holder even before anyone took over (a live worker's heartbeat
    renews the lease, so a healthy step never gets here before its hard time limit). Its own: on
    PostgreSQL the claim commits without waiting for its WAL flush, so a database crash can lose
    a claim and a later claim can reuse its epoch number; the owner (host, pid, task id) still
    tells the two holders apart."""
    return and_(runs.c.lease_expires_at > now, runs.c.lease_owner == claim.record.lease_owner)


_cache_lock = threading.Lock()
_cache: dict[str, Store] = {}


def forget_stores() -> None:
    """Drop cached stores (after a fork, or between tests that change RATCHET_DATABASE_URL)."""
    with _cache_lock:
        for store in _cache.values():
            if store._watcher is not None:
                store._watcher.close()
            store.engine.dispose(close=False)
            if store.lazy_engine is not store.engine:
                store.lazy_engine.dispose(close=False)
            if store.quick_engine.pool is not store.engine.pool:
                store.quick_engine.dispose(close=False)
        _cache.clear()
