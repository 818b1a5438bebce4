"""The run store on PostgreSQL: one round trip wherever it can be one, and waiters woken by NOTIFY.

Reads and the claim run on a second pool in autocommit (see `_open_quick_engine`); a new run and
a step's commit are one statement each (`statements.CREATE_PG`, `COMMIT_PG`), sent autocommitted;
the claim and `get_output` read the run with its transcript in one statement. Every move to a
final status sends a NOTIFY that `FinalWatcher` turns into a wake-up of the producers waiting.
If the database's default isolation is stricter than READ COMMITTED, the single statements run in
transactions pinned to READ COMMITTED instead: one round trip more each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from orchestrator.errors import RunNotFoundError
from orchestrator.messages import Message
from orchestrator.run import RunOutput, RunRecord
from orchestrator.state import from_json
from orchestrator.status import RunStatus
from orchestrator.store import claims, deciding, direct, reads, sessions, statements
from orchestrator.store.backend import Backend
from orchestrator.store.claims import Claim
from orchestrator.store.database import PG_ISOLATION, autocommit_is_read_committed
from orchestrator.store.notify import FinalWatcher, notify_final
from orchestrator.store.transcripts import TranscriptCache

T = TypeVar("T")


class PostgresBackend(Backend):
    """The store on a PostgreSQL database, possibly behind a transaction-pooling PgBouncer."""

    binds_arrays = True

    def __init__(self, engine: Engine) -> None:
        #: Whether single statements (the claim, a step's commit, a new run, reads) can be sent
        #: autocommitted: only where that runs them READ COMMITTED (`autocommit_is_read_committed`).
        self.autocommit = autocommit_is_read_committed(engine)
        self._watcher: FinalWatcher | None = None
        self._watcher_lock = threading.Lock()
        # Lazy writes need no engine of their own: they run on the quick pool (see `lazy`).
        super().__init__(engine, quick_engine=self._open_quick_engine(engine), lazy_engine=engine)

    def _open_quick_engine(self, engine: Engine) -> Engine:
        """A second pool, autocommit, so a read or the claim's single statement costs one round
        trip (no BEGIN, COMMIT or ROLLBACK). Built from the engine's URL (so PGOPTIONS, a service
        file or `?options=` apply to both pools alike), it sets nothing on its sessions, so it is
        safe behind a transaction-pooling PgBouncer: the claim turns off synchronous commit for its
        own transaction only (`statements.CLAIM_PG`). Every durable write goes through `engine`.

        No pre-ping: `quick` retries once when the server dropped the connection, so a database
        restart costs one failed round trip, not a ping before every statement. A new run is
        written here too (`create_alone`), so errors hide their parameters if the engine's do.
        Where autocommit would not run READ COMMITTED, the pool's transactions are pinned to it
        instead."""
        level = "AUTOCOMMIT" if self.autocommit else PG_ISOLATION
        return create_engine(
            engine.url,
            isolation_level=level,
            pool_pre_ping=False,
            pool_size=5,
            max_overflow=20,
            hide_parameters=engine.hide_parameters,  # a new run's statement carries its input
        )

    def quick(self, work: Callable[[Connection], T]) -> T:
        """On a pool without pre-ping: when the server dropped the connection (a restart, a
        failover, an idle timeout), the pool is refreshed and `work` runs once more on a new one."""
        try:
            return self._quick_once(work)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
        return self._quick_once(work)

    def _quick_once(self, work: Callable[[Connection], T]) -> T:
        with self.quick_engine.connect() as conn:
            result = work(conn)
            if not self.autocommit:  # a pinned READ COMMITTED transaction
                conn.commit()
            return result

    def snapshot(self, work: Callable[[Connection], T]) -> T:
        # READ COMMITTED (and autocommit) give each statement its own snapshot. On the quick
        # pool, so that readers following runs never take connections the writes need.
        with self.quick_engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                return work(conn)

    def lazy(self, work: Callable[[Connection], T]) -> T:
        # One autocommitted statement. The claim does not wait for its WAL flush (CLAIM_PG): if
        # the database crashes and loses it, the run is back as it was, the step's commit (fenced
        # by the claim's epoch and owner) fails, and the sweeper republishes. A synchronous commit
        # that follows (the step's, or an at-most-once tool's start) flushes the WAL in order,
        # claim first. If a dropped connection hid a claim that did commit, the retry finds the
        # run RUNNING and drops the delivery; the sweeper takes the run back when the lease ends.
        return self.quick(work)

    @contextmanager
    def single_statement(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            if self.autocommit:  # no BEGIN and COMMIT round trips around the one statement
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            with conn.begin():
                yield conn

    def create_alone(self, values: dict[str, Any], input_messages: Sequence[Message]) -> RunRecord:
        # On the quick pool, whose connections are not pinged before use: a start costs the one
        # round trip of its statement, and it is as durable as on the other pool (CREATE_PG
        # keeps synchronous commit). `quick` sends it once more if the server dropped the
        # connection; if the run is then there with this write's own created_at (to the
        # microsecond), session and agent, the first attempt landed before the drop: it is this run.
        # (Another start's run_id costs that one read before its conflict is raised.)
        try:
            return self.quick(lambda conn: self.create(conn, values, input_messages))
        except IntegrityError:
            landed = self.quick(lambda conn: reads.find_record(conn, values["run_id"]))
            if landed is None or (landed.created_at, landed.session_id, landed.agent_name) != (
                values["created_at"],
                values["session_id"],
                values["agent_name"],
            ):
                raise
            return landed

    def create(self, conn: Connection, values: dict[str, Any], input_messages: Sequence[Message]) -> RunRecord:
        params = {f"b_r_{k}": v for k, v in values.items()}
        params.update(b_session_id=values["session_id"], b_now=values["created_at"], b_user_id=values["user_id"])
        params.update(statements.message_arrays(input_messages))
        row = direct.first(conn, statements.CREATE_PG, params)
        if row is None:  # the session is another user's: nothing was written
            raise sessions.refused(values["session_id"])
        return RunRecord.from_row(row)

    def lock_names(self, conn: Connection, names: Sequence[str]) -> None:
        # Advisory locks the transaction holds to its end, each on a 64-bit hash of its name: two
        # names of one hash only wait for each other.
        for name in names:
            conn.execute(statements.LOCK_NAME, {"b_name": name})

    def claim(self, conn: Connection, params: dict[str, Any], cache: TranscriptCache) -> Claim | None:
        # The claim and the messages this process has not cached yet, in one round trip.
        known = cache.known(params["b_run_id"])
        row = direct.first(conn, statements.CLAIM_PG, {**params, "b_since": len(known)})
        if row is None:
            return None
        record = RunRecord.from_row(row)
        tail = statements.messages_from_json(row.messages_json)
        transcript = claims.transcript(conn, cache, record, known=known, tail=tail)
        return Claim(record=record, transcript=transcript)

    def commit(
        self, conn: Connection, params: dict[str, Any], new_messages: Sequence[Message], *, seq: int, final: bool
    ) -> RunRecord | None:
        if params["b_status"] == RunStatus.COMPLETED.value:  # with its "completed" event (metrics)
            statement = statements.COMMIT_PG_COMPLETED
        else:
            statement = statements.COMMIT_PG_FINAL if final else statements.COMMIT_PG
        row = direct.first(conn, statement, {**params, "b_step": seq, **statements.message_arrays(new_messages)})
        return RunRecord.from_row(row) if row is not None else None

    def decide_at_once(self, bound: dict[str, Any]) -> deciding.AtOnce | None:
        # One autocommitted statement on the pool that is not pinged. If the server dropped the
        # connection, `quick` sends it again: had the first landed, the second matches nothing, and
        # the general path answers the same decision again as stored (the run it queued is then
        # published by the sweeper, its outbox marker set by the first).
        return self.quick(lambda conn: deciding.decide_pg(conn, bound))

    def output(self, conn: Connection, run_id: str) -> RunOutput:
        # The run and its transcript in one round trip.
        row = direct.first(conn, statements.RUN_PG, {"b_run_id": run_id, "b_since": 0})
        if row is None:
            raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")
        transcript = statements.messages_from_json(row.messages_json)
        return reads.output_of(conn, RunRecord.from_row(row), transcript, from_json(row.session_state_json))

    def event_rows(self, run_id: str, since: int) -> reads.EventRows:
        # What a reader polls: one statement (its own snapshot) on the quick pool, not a
        # REPEATABLE READ transaction of three reads. A team's member runs are read with it
        # in the transaction, as before.
        row = self.quick(lambda c: direct.first(c, statements.RUN_EVENTS_PG, {"b_run_id": run_id, "b_since": since}))
        if row is None:
            raise RunNotFoundError(f"no run with run_id {run_id!r} in this database")
        record = RunRecord.from_row(row)
        if record.kind == "team":
            return super().event_rows(run_id, since)
        tail, logged = statements.event_rows(row.messages_json), statements.logged_rows(row.events_json)
        # A run that paused: what it asked, read after (its rows are written with the pause, and
        # each decision with the event the snapshot shows of it).
        asked = (
            self.quick(lambda c: reads.paused_requirements(c, record, logged))
            if any(r.kind == "paused" for r in logged)
            else []
        )
        return reads.EventRows(record=record, messages=tail, logged=logged, requirements=asked)

    def on_final(self, conn: Connection, run_id: str) -> None:
        notify_final(conn, run_id)

    def final_watcher(self) -> FinalWatcher | None:
        with self._watcher_lock:
            if self._watcher is None:
                dsn = self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
                self._watcher = FinalWatcher(dsn)
            return self._watcher

    def dispose(self, *, close: bool) -> None:
        if self._watcher is not None:
            self._watcher.close()
        self.engine.dispose(close=close)  # the lazy engine too: it is the same
        self.quick_engine.dispose(close=close)
