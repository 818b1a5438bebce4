"""The run store on both databases: migrations, the write at enqueue, append-only checkpoints."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from importlib import resources
from typing import Any

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, make_url, text

from orchestrator import Agent, Client, RunStatus
from orchestrator.errors import FencedError, RunConflictError
from orchestrator.messages import Message, ToolCall
from orchestrator.settings import Settings
from orchestrator.store import Store, writes
from orchestrator.store import statements as statements_module
from orchestrator.store.claims import Claim
from orchestrator.store.database import migrate, open_engine
from orchestrator.store.notify import notify_final
from orchestrator.testing.scripted_model import ScriptedModel


@contextmanager
def statements(store: Store) -> Iterator[list[str]]:
    """Every SQL statement the store's engine executes inside the block."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()).upper())

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def dumps(items: list[Message]) -> list[dict[str, Any]]:
    return [m.model_dump(exclude={"created_at"}) for m in items]


def new_run(store: Store, text_in: str = "hello") -> str:
    run_id = str(uuid.uuid4())
    store.create_run(
        run_id=run_id, session_id=f"s-{run_id[:6]}", agent_name="nobody", kind="agent",
        input_messages=[Message(role="user", content=text_in)], publish_grace=60,
    )  # fmt: skip
    return run_id


def test_migrations_bring_the_database_to_the_newest_revision(settings: Settings) -> None:
    store = Store.open(settings.database_url)
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("orchestrator.store") / "migrations"))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    with store.engine.connect() as conn:
        assert conn.execute(text("select version_num from alembic_version")).scalar() == head
    # Migrating again is idempotent: fresh engines (Store.open would return its cached store)
    # migrate the migrated database twice, and it stays at the head.
    for _ in range(2):
        engine = open_engine(settings.database_url)
        try:
            migrate(engine)
            with engine.connect() as conn:
                assert conn.execute(text("select version_num from alembic_version")).scalar() == head
        finally:
            engine.dispose()


def test_the_run_and_its_user_message_exist_before_any_worker_sees_the_run(settings: Settings) -> None:
    # No worker consumes this test's queues: the task waits in Redis.
    Agent(name="lonely", model=ScriptedModel(), client=Client(settings))
    handle = Client(settings).start("lonely", input="are you there?", session_id="s-lonely")
    run = Client(settings).get_run(handle.run_id)
    assert run.status == RunStatus.QUEUED
    assert [(m.role, m.content) for m in run.messages] == [("user", "are you there?")]
    assert run.session_id == "s-lonely"


def test_a_checkpoint_inserts_only_the_new_messages_and_never_rewrites_earlier_ones(settings: Settings) -> None:
    store = Store.open(settings.database_url)
    run_id = new_run(store)
    for step in range(3):
        claim = store.claim(run_id, step, "model", owner="t", lease_seconds=30, max_attempts=5)
        assert claim is not None
        call = ToolCall(id=f"c{step}", name="noop")
        with statements(store) as seen:
            store.commit_step(
                claim, [Message(role="assistant", tool_calls=[call.to_openai()])],
                status=RunStatus.QUEUED, next_step="model", publish_grace=60,
            )  # fmt: skip
        # One statement appends to the messages (on PostgreSQL, the same one that moves the run);
        # none updates or deletes a message.
        touching_messages = [s for s in seen if "RATCHET_MESSAGES" in s]
        assert len(touching_messages) == 1 and "INSERT INTO RATCHET_MESSAGES" in touching_messages[0]
        assert not any(f"{verb} RATCHET_MESSAGES" in s for s in seen for verb in ("UPDATE", "DELETE FROM"))
    rows = store.get_messages(run_id)
    assert [m.role for m in rows] == ["user", "assistant", "assistant", "assistant"]


def test_message_indexes_are_unique_per_run(settings: Settings) -> None:
    store = Store.open(settings.database_url)
    run_id = new_run(store)
    with pytest.raises(Exception, match="(?i)unique|duplicate"):
        with store.engine.begin() as conn:
            writes.insert_messages(conn, run_id, 0, [Message(role="user", content="again")], 0.0, seq=None, epoch=None)


def test_sqlite_stores_run_in_wal_mode_with_a_busy_timeout(tmp_path: Any) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'wal.db'}")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000


def test_a_claim_lost_in_a_database_crash_cannot_let_two_holders_share_an_epoch(settings: Settings) -> None:
    # Given worker A's claim, which PostgreSQL commits without waiting for its WAL flush
    store = Store.open(settings.database_url)
    run_id = new_run(store)
    a = store.claim(run_id, 0, "model", owner="host:1:task-a", lease_seconds=30, max_attempts=5)
    assert a is not None
    # When a crash loses that claim (the row is back as it was) and worker B claims the same step
    with store.engine.begin() as conn:
        conn.execute(text("update ratchet_runs set status='QUEUED', epoch=epoch-1, lease_owner=null where run_id=:r"),
                     {"r": run_id})  # fmt: skip
    b = store.claim(run_id, 0, "model", owner="host:2:task-b", lease_seconds=30, max_attempts=5)
    assert b is not None and b.epoch == a.epoch  # the epoch number is reused
    # Then A, still running, is fenced by owner; B commits
    reply = [Message(role="assistant", content="done")]
    with pytest.raises(FencedError):
        store.commit_step(a, reply, status=RunStatus.COMPLETED, next_step=None, publish_grace=60)
    with pytest.raises(FencedError):
        store.append_tool_result(a, Message(role="tool", tool_call_id="x", tool_name="t", content="late"))
    store.commit_step(b, reply, status=RunStatus.COMPLETED, next_step=None, publish_grace=60)
    assert [m.content for m in store.get_messages(run_id)] == ["hello", "done"]


def test_postgres_claims_commit_without_waiting_for_the_wal_and_leave_no_session_setting_behind(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server's default, not the one the tests' databases are made with (tests/isolation.py)
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'ALTER DATABASE "{make_url(pg_url).database}" RESET synchronous_commit')
    admin.dispose()
    # PGOPTIONS (or a service file) reaches both pools: claims and reads see what writes see
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=4321")
    store = Store(open_engine(pg_url))
    for engine in (store.engine, store.quick_engine):
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "4321ms"
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
    with store.quick_engine.connect() as conn:
        assert conn.connection.driver_connection.autocommit  # type: ignore[union-attr]
    # The claim statement turns synchronous commit off for its own transaction, and only for it
    run_id = new_run(store)
    claim_params = dict(
        b_run_id=run_id, b_now=0.0, b_seq=0, b_kind="model", b_owner="host:1:t", b_expires=30.0,
        b_cap=5, b_since=0,
    )  # fmt: skip
    with store.engine.connect() as conn:
        with conn.begin() as tx:
            assert conn.execute(statements_module.CLAIM_PG, claim_params).first() is not None
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"
            tx.rollback()
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
    # Through the store, the claim is committed when claim() returns: another connection sees it
    claim = store.claim(run_id, 0, "model", owner="host:1:t", lease_seconds=30, max_attempts=5)
    assert claim is not None
    with store.engine.connect() as conn:
        seen = conn.execute(text("select status, lease_owner from ratchet_runs where run_id=:r"), {"r": run_id}).one()
        assert tuple(seen) == ("RUNNING", "host:1:t")
    with store.quick_engine.connect() as conn:
        assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "on"
    store.engine.dispose(), store.quick_engine.dispose()


def test_a_connection_the_server_dropped_costs_no_read_claim_or_commit(pg_url: str) -> None:
    # Given a store whose pooled connections (one in each pool) worked a moment ago
    store = Store.open(pg_url)
    run_id = new_run(store)
    pids = set()
    for engine in (store.engine, store.quick_engine):
        with engine.connect() as conn:
            pids.add(conn.exec_driver_sql("select pg_backend_pid()").scalar())
    # When the server drops them (a restart, a failover, an idle-connection killer)
    admin = open_engine(pg_url)
    with admin.connect() as conn:
        for pid in pids:
            assert conn.execute(text("select pg_terminate_backend(:p)"), {"p": pid}).scalar()
    admin.dispose()
    # Then reads, the claim and the step's commit go on, each on a new connection
    assert store.get_output(run_id).status == RunStatus.QUEUED
    claim = store.claim(run_id, 0, "model", owner="host:1:t", lease_seconds=30, max_attempts=5)
    assert claim is not None and [m.content for m in claim.messages] == ["hello"]
    store.commit_step(claim, [Message(role="assistant", content="done")], status=RunStatus.COMPLETED,
                      next_step=None, publish_grace=60, content="done")  # fmt: skip
    assert store.get_output(run_id).content == "done"


def test_postgres_commits_a_step_in_one_statement_and_wakes_waiters_only_on_a_final_move(pg_url: str) -> None:
    store = Store.open(pg_url)
    watcher = store.final_watcher()
    assert watcher is not None
    run_id = new_run(store)
    woken = watcher.subscribe(run_id)
    assert woken is not None
    call = ToolCall(id="c0", name="noop")
    # A step that is not final: one statement, no notice
    claim = store.claim(run_id, 0, "model", owner="host:1:t", lease_seconds=30, max_attempts=5)
    assert claim is not None
    with statements(store) as seen:
        store.commit_step(claim, [Message(role="assistant", tool_calls=[call.to_openai()])],
                          status=RunStatus.QUEUED, next_step="tools", publish_grace=60)  # fmt: skip
    assert len(seen) == 1 and seen[0].startswith("WITH MOVED AS (UPDATE RATCHET_RUNS")
    # A fenced final commit writes nothing and wakes nobody
    claim = store.claim(run_id, 1, "tools", owner="host:1:t", lease_seconds=30, max_attempts=5)
    assert claim is not None
    stale = Claim(record=replace(claim.record, lease_owner="host:2:old"), transcript=claim.transcript)
    with pytest.raises(FencedError):
        store.commit_step(stale, [Message(role="tool", tool_call_id="c0", tool_name="noop", content="x")],
                          status=RunStatus.COMPLETED, next_step=None, publish_grace=60)  # fmt: skip
    assert [m.role for m in store.get_messages(run_id)] == ["user", "assistant"]
    # No notice came for the non-final or the fenced commit: notices arrive in commit order, so
    # once a later one (a marker sent now) has arrived, an earlier one would have too
    marker = watcher.subscribe("marker-" + run_id)
    assert marker is not None
    with store.engine.begin() as conn:
        notify_final(conn, "marker-" + run_id)
    assert marker.wait(10)
    assert not woken.is_set()
    # The final commit wakes the waiter
    store.commit_step(claim, [Message(role="tool", tool_call_id="c0", tool_name="noop", content="ok")],
                      status=RunStatus.COMPLETED, next_step=None, publish_grace=60, content="ok")  # fmt: skip
    assert woken.wait(10)
    watcher.unsubscribe(run_id, woken)
    assert [m.role for m in store.get_messages(run_id)] == ["user", "assistant", "tool"]


def test_starting_a_run_id_that_exists_is_refused_and_leaves_the_first_run_alone(settings: Settings) -> None:
    Agent(name="first-come", model=ScriptedModel(), client=Client(settings))
    client = Client(settings)
    first = client.start("first-come", input="first", run_id="run-taken", session_id="s-1")
    with pytest.raises(RunConflictError, match="'run-taken' is already a run of agent 'first-come' in session 's-1'"):
        client.start("first-come", input="second", run_id="run-taken", session_id="s-2")
    run = client.get_run(first.run_id)
    assert (run.session_id, [m.content for m in run.messages]) == ("s-1", ["first"])
    assert client.get_session("s-2") is None  # nothing of the refused start was written


def test_a_claim_and_a_read_return_the_committed_transcript_whatever_the_process_cached(settings: Settings) -> None:
    # Two stores on one database stand for two worker processes, each with its own transcript cache
    a = Store.open(settings.database_url)
    b = Store(a.engine)
    run_id = new_run(a, "héllo ✓")
    call = ToolCall(id="c1", name="search", arguments='{"q": "naïve"}')
    steps = [
        (a, "model", [Message(role="assistant", content=None, tool_calls=[call.to_openai()])], "tools"),
        (b, "tools", [Message(role="tool", tool_call_id="c1", tool_name="search", content="found",
                              tool_args={"q": "naïve"}, tool_call_error=True)], "model"),
        (a, "model", [Message(role="assistant", content="done — ok")], None),
    ]  # fmt: skip
    for seq, (store, kind, new, next_step) in enumerate(steps):
        claim = store.claim(run_id, seq, kind, owner=f"host:{seq}:t", lease_seconds=30, max_attempts=5)
        assert claim is not None
        # What the claim hands the step is what is stored, though `a` cached part of it (the cache
        # keeps messages as the step made them, without the row's timestamp)
        assert dumps(claim.messages) == dumps(a.get_messages(run_id))
        status = RunStatus.COMPLETED if next_step is None else RunStatus.QUEUED
        store.commit_step(claim, new, status=status, next_step=next_step, publish_grace=60)
    stored = a.get_messages(run_id)
    assert [m.model_dump() for m in a.get_output(run_id).messages] == [m.model_dump() for m in stored]
    assert all(m.created_at for m in stored)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "héllo ✓"), ("assistant", None), ("tool", "found"), ("assistant", "done — ok")
    ]  # fmt: skip
    assert stored[1].calls == [call] and stored[2].tool_args == {"q": "naïve"} and stored[2].tool_call_error
    if b.quick_engine.pool is not b.engine.pool:
        b.quick_engine.dispose()


def test_a_cached_prefix_that_disagrees_with_the_store_is_dropped_and_the_transcript_read_again(
    settings: Settings,
) -> None:
    store = Store.open(settings.database_url)
    run_id = new_run(store, "the stored one")
    # A cache that claims more messages than the run has committed (it cannot happen to committed
    # rows; if it ever did, the store must be believed)
    store.transcripts.extend(run_id, 0, [Message(role="user", content=t) for t in ("bogus", "prefix")])
    claim = store.claim(run_id, 0, "model", owner="host:1:t", lease_seconds=30, max_attempts=5)
    assert claim is not None
    assert [m.content for m in claim.messages] == ["the stored one"]
    assert [m.content for m in store.transcripts.known(run_id).messages] == ["the stored one"]


def test_on_sqlite_a_read_neither_waits_for_a_writer_nor_takes_the_write_lock(tmp_path: Any) -> None:
    store = Store.open(f"sqlite:///{tmp_path / 'reads.db'}")
    run_id = new_run(store)
    # While another connection holds the write lock with an uncommitted change
    with store.engine.begin() as writer:
        writer.execute(text("update ratchet_runs set content='uncommitted' where run_id=:r"), {"r": run_id})
        # a read answers at once with the committed state (BEGIN IMMEDIATE would wait 30 s, then fail)
        with statements(store) as seen:
            assert store.get_output(run_id).content is None
        assert seen and not any(s.startswith("BEGIN IMMEDIATE") for s in seen)
    # and writes still take the lock first
    with statements(store) as seen, store.engine.begin() as conn:
        conn.execute(text("select 1"))
    assert seen[0] == "BEGIN IMMEDIATE"


def test_every_write_of_the_outbox_marker_follows_where_it_leaves_the_run(settings: Settings) -> None:
    now = 1_000.0
    store = Store(Store.open(settings.database_url).engine, clock=lambda: now)
    # A new run, published by its writer: due for the sweeper once the grace is over
    run_id = new_run(store)
    assert store.get_record(run_id).publish_after == now + 60
    # A publish that failed: due at the next sweep
    assert store.mark_due(run_id, epoch=0)
    assert store.get_record(run_id).publish_after == now
    # A move to QUEUED whose writer publishes the step, and one that leaves it to the sweeper
    for grace, due in ((30.0, now + 30), (None, now)):
        assert store.claim(run_id, 0, "model", owner="t", lease_seconds=30, max_attempts=5) is not None
        moved = store.move(run_id, src=(RunStatus.RUNNING,), dst=RunStatus.QUEUED, bump_epoch=True, publish_grace=grace)
        assert moved is not None and moved.publish_after == due
    # Any other status has nothing to publish, and nobody writes the marker by hand
    with pytest.raises(TypeError, match="outbox marker"):
        store.move(run_id, src=(RunStatus.QUEUED,), dst=RunStatus.CANCELLED, publish_after=None)
    moved = store.move(run_id, src=(RunStatus.QUEUED,), dst=RunStatus.CANCELLED)
    assert moved is not None and moved.publish_after is None
    assert not store.mark_due(run_id, epoch=moved.epoch)  # only a QUEUED run has a marker to set
    if store.quick_engine.pool is not store.engine.pool:
        store.quick_engine.dispose()
