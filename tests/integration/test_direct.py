"""The hot statements run through the driver (`orchestrator.store.direct`) give what SQLAlchemy
gives, on both databases: the same rows and types, its wrapped errors, and a connection that an
exit left in an unknown state is not used again."""

from __future__ import annotations

import signal
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from orchestrator.messages import Message, ToolCall
from orchestrator.run import RunRecord
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.store import Store, statements
from orchestrator.store.database import open_engine
from orchestrator.store.direct import Direct
from orchestrator.store.tables import messages, runs
from orchestrator.usage import Metrics


def stored_run(store: Store, run_id: str) -> tuple[Any, list[Any]]:
    """The run's row and message rows as SQLAlchemy reads them."""
    with store.engine.connect() as conn:
        run = conn.execute(select(runs).where(runs.c.run_id == run_id)).one()
        rows = conn.execute(select(messages).where(messages.c.run_id == run_id).order_by(messages.c.idx)).all()
    return run, rows


def typed(values: Any) -> list[tuple[type, Any]]:
    return [(type(v), v) for v in values]


def test_a_run_created_claimed_and_committed_directly_reads_back_as_sqlalchemy_reads_it(settings: Settings) -> None:
    store = Store.open(settings.database_url)
    run_id = f"direct-{uuid.uuid4().hex}"

    # Given a run written, claimed and committed through the direct statements
    created = store.create_run(
        run_id=run_id, session_id=f"s-{run_id}", agent_name="nobody", kind="agent", stream=True, priority=3,
        input_messages=[Message(role="user", content="héllo \U0001f600")], publish_grace=60, user_id="u1",
    )  # fmt: skip
    claim = store.claim(run_id, 0, "model", owner="w1", lease_seconds=30, max_attempts=5)
    assert claim is not None
    reply = Message(
        role="assistant", content=None, tool_calls=[ToolCall(id="c1", name="lookup", arguments='{"q": 1}').to_openai()],
        metrics=Metrics(input_tokens=7, output_tokens=3, cost=0.25),
    )  # fmt: skip
    committed = store.commit_step(
        claim, [reply], status=RunStatus.QUEUED, next_step="tools", publish_grace=60, content=None
    )

    # Then each row the driver returned is the row SQLAlchemy reads: same values, same types
    run, rows = stored_run(store, run_id)
    assert committed == RunRecord.from_row(run)
    assert typed(vars(committed).values()) == typed(vars(RunRecord.from_row(run)).values())
    assert created.stream is True and claim.record.stream is True and committed.stream is True
    statuses = (created.status, claim.record.status, committed.status)
    assert statuses == (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.QUEUED)
    assert claim.messages == [Message.from_row(rows[0])]
    assert [Message.from_row(r) for r in rows][1:] == [reply.model_copy(update={"created_at": rows[1].created_at})]
    assert rows[1].tool_call_error is False and rows[1].seq == 0 and rows[1].epoch == 1


def test_every_direct_read_gives_the_rows_sqlalchemy_gives(settings: Settings) -> None:
    store = Store.open(settings.database_url)
    run_id = f"direct-{uuid.uuid4().hex}"
    store.create_run(
        run_id=run_id, session_id=f"s-{run_id}", agent_name="nobody", kind="agent",
        input_messages=[Message(role="user", content="one"), Message(role="user", content="two")], publish_grace=60,
        session_state={"k": [1, "two"]},
    )  # fmt: skip
    with store.engine.begin() as conn:
        store.log_event(conn, run_id, "retry", 0, delay=1.5)
    reads = [
        (statements.RUN, {"b_run_id": run_id}),
        (statements.MESSAGES, {"b_run_id": run_id, "b_since": 1}),
        (statements.EVENTS, {"b_run_id": run_id}),
        (statements.SESSION_STATE, {"b_session_id": f"s-{run_id}"}),
    ]
    if store.engine.dialect.name == "postgresql":
        reads += [(s, {"b_run_id": run_id, "b_since": 0}) for s in (statements.RUN_PG, statements.RUN_EVENTS_PG)]
    for statement, params in reads:
        with store.engine.connect() as conn:
            expected = [tuple(r) for r in conn.execute(statement, params)]
            got = [tuple(r) for r in Direct(statement, store.engine.dialect).rows(conn, params)]
        assert [typed(r) for r in got] == [typed(r) for r in expected]
        assert got


def test_a_run_id_taken_twice_raises_sqlalchemys_integrity_error(settings: Settings) -> None:
    store = Store.open(settings.database_url)
    run_id = new_run(store)
    with pytest.raises(IntegrityError):
        store.create_run(
            run_id=run_id, session_id="s", agent_name="a", kind="agent",
            input_messages=[Message(role="user", content="hi")], publish_grace=60,
        )  # fmt: skip
    assert store.get_record(run_id).n_messages == 1


def test_an_engine_that_hides_parameters_keeps_them_out_of_a_direct_statements_error(settings: Settings) -> None:
    # A deployment that sets hide_parameters keeps what runs carry out of errors and the logs
    # that print them, on the driver's path as on SQLAlchemy's
    Store.open(settings.database_url)  # migrated
    store = Store(open_engine(settings.database_url, hide_parameters=True))
    run_id = new_run(store)
    secret = "sk-" + uuid.uuid4().hex
    try:
        with pytest.raises(IntegrityError) as raised:
            store.create_run(
                run_id=run_id, session_id="s", agent_name="a", kind="agent",
                input_messages=[Message(role="user", content=secret)], publish_grace=60,
            )  # fmt: skip
    finally:
        store.engine.dispose()
        store.quick_engine.dispose()
    text = str(raised.value)  # the driver's message may name the key (its run id), never the values
    assert secret not in text
    assert "hidden due to hide_parameters" in text


def test_an_exit_in_the_middle_of_a_direct_statement_drops_its_connection(pg_url: str) -> None:
    # Given a claim whose statement waits on a row lock another session holds
    store = Store.open(pg_url)
    run_id = new_run(store)
    blocker = psycopg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False))
    blocker.execute("SELECT 1 FROM ratchet_runs WHERE run_id = %s FOR UPDATE", (run_id,))
    backend = lambda: store._backend.quick(lambda c: c.exec_driver_sql("SELECT pg_backend_pid()").scalar())  # noqa: E731
    before = backend()

    def leave(*_: Any) -> None:
        raise SystemExit(3)  # what a pool process at its hard time limit raises, mid-statement

    previous = signal.signal(signal.SIGALRM, leave)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        # When an exit arrives while the driver waits for the statement's answer
        with pytest.raises(SystemExit):
            store.claim(run_id, 0, "model", owner="w1", lease_seconds=30, max_attempts=5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        blocker.rollback()
        blocker.close()

    # Then its connection was dropped (the driver's state after an exit is not trusted), as
    # SQLAlchemy drops one, and the pool goes on with another
    assert backend() != before
    assert store.get_record(run_id).run_id == run_id
    assert store.get_messages(run_id)[0].content == "hello"


def test_a_watched_engine_runs_the_statements_through_sqlalchemy(settings: Settings) -> None:
    # An instrumentation's listener expects SQLAlchemy's execution context: it gets one
    store = Store.open(settings.database_url)
    contexts: list[Any] = []

    def watch(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        contexts.append(context)

    engines = {id(e): e for e in (store.engine, store.lazy_engine, store.quick_engine)}.values()
    for engine in engines:
        event.listen(engine, "before_cursor_execute", watch)
    try:
        run_id = new_run(store)
        claim = store.claim(run_id, 0, "model", owner="w1", lease_seconds=30, max_attempts=5)
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", watch)
    assert claim is not None and claim.record.stream is False and claim.messages[0].content == "hello"
    assert contexts and all(c is not None for c in contexts)


def new_run(store: Store) -> str:
    run_id = f"direct-{uuid.uuid4().hex}"
    store.create_run(
        run_id=run_id, session_id="s", agent_name="a", kind="agent",
        input_messages=[Message(role="user", content="hello")], publish_grace=60,
    )  # fmt: skip
    return run_id


def test_a_direct_statement_on_a_connection_the_server_dropped_is_sent_again_on_a_new_one(pg_url: str) -> None:
    # Given the server ended the pooled connection the next claim will take (a restart, a failover)
    store = Store.open(pg_url)
    run_id = new_run(store)
    backend = lambda: store._backend.quick(lambda c: c.exec_driver_sql("SELECT pg_backend_pid()").scalar())  # noqa: E731
    dropped = backend()
    with psycopg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (dropped,))

    # When the claim runs: the driver's error comes out as SQLAlchemy's for a dropped connection
    # (the transaction's end on the dead connection says so too), and the quick pool's retry
    # sends the claim once more on a new connection
    claim = store.claim(run_id, 0, "model", owner="w1", lease_seconds=30, max_attempts=5)

    assert claim is not None and claim.record.epoch == 1
    assert backend() != dropped


def test_a_start_on_a_connection_the_server_dropped_is_written_on_a_new_one(pg_url: str) -> None:
    # Given the server ended the pooled connection the next start will take (a restart, a failover)
    store = Store.open(pg_url)
    new_run(store)
    backend = lambda: store._backend.quick(lambda c: c.exec_driver_sql("SELECT pg_backend_pid()").scalar())  # noqa: E731
    dropped = backend()
    with psycopg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (dropped,))

    # When a run starts: its statement is sent again on a new connection, and the run is written
    run_id = new_run(store)

    assert store.get_record(run_id).status == RunStatus.QUEUED
    assert backend() != dropped


def test_after_the_server_dropped_every_pooled_connection_the_next_start_and_claim_go_through(pg_url: str) -> None:
    # Given three idle connections in the quick pool, all ended by the server (a restart)
    store = Store.open(pg_url)
    run_id = new_run(store)
    pool = store._backend.quick_engine
    held = [pool.connect() for _ in range(3)]
    pids = [c.exec_driver_sql("SELECT pg_backend_pid()").scalar() for c in held]
    for c in held:
        c.close()
    with psycopg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    # When a run starts and another's step is claimed: the first dead connection found makes the
    # pool recycle the others, so the one retry each gets runs on a live connection
    started = new_run(store)
    claim = store.claim(run_id, 0, "model", owner="w1", lease_seconds=30, max_attempts=5)

    assert store.get_record(started).status == RunStatus.QUEUED
    assert claim is not None and claim.record.epoch == 1


def test_a_start_takes_no_connection_of_the_pool_that_pings_before_use(pg_url: str) -> None:
    # A new run is one statement, one round trip: the pool of durable writes pings each
    # connection it hands out (SELECT 1 first), the quick pool retries on a dropped connection.
    store = Store.open(pg_url)
    taken: list[object] = []

    def checkout(*args: object) -> None:
        taken.append(args)

    event.listen(store.engine, "checkout", checkout)
    try:
        run_id = new_run(store)
    finally:
        event.remove(store.engine, "checkout", checkout)
    assert store.get_record(run_id).status == RunStatus.QUEUED
    assert taken == []


def test_a_start_whose_statement_landed_before_its_connection_dropped_returns_that_run(pg_url: str) -> None:
    # Given a start whose statement committed, then the server ended its connection before the
    # reply came back: the same write, sent again on a new connection, finds the run it wrote
    engine = Store.open(pg_url).engine
    store = Store(engine, clock=lambda: 1_700_000_000.123456)
    run_id = f"direct-{uuid.uuid4().hex}"

    def start(on: Store) -> RunRecord:
        return on.create_run(
            run_id=run_id, session_id=f"s-{run_id}", agent_name="a", kind="agent",
            input_messages=[Message(role="user", content="hello")], publish_grace=60,
        )  # fmt: skip

    landed = start(store)

    def drop_the_pooled_connection() -> None:
        pid = store._backend.quick(lambda c: c.exec_driver_sql("SELECT pg_backend_pid()").scalar())
        with psycopg.connect(make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)) as a:
            a.execute("SELECT pg_terminate_backend(%s)", (pid,))

    # When the write is sent again after its connection dropped: it is that run, written once
    drop_the_pooled_connection()
    assert start(store) == landed
    assert len(store.get_messages(run_id)) == 1

    # and a write of another start with the same run_id is still the conflict it is (Client.start
    # tells a retry of the same start from another run's id by it)
    later = Store(engine, clock=lambda: 1_700_000_001.0)
    try:
        with pytest.raises(IntegrityError):
            start(later)
    finally:
        store.quick_engine.dispose()
        later.quick_engine.dispose()
