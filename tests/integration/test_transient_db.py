"""A transient database error while a step commits (a dropped connection, a failover, SQLite busy)
is tried again: the paid-for model reply is committed once and the run goes on, never to ERROR.

The faults are real: the PostgreSQL server really terminates the worker's connection as the
commit is sent, and another SQLite connection really holds the write lock.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

from orchestrator import Agent, Client, RunStatus
from orchestrator.messages import Message
from orchestrator.models.base import CallContext, Model, ModelReply, ToolSpec
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.transient import is_transient
from tests.conftest import make_settings

S = RunStatus


class Once(Model):
    """Answers every call with `reply`, counting calls and calling `on_call` first."""

    def __init__(self, reply: ModelReply, on_call: Any = None) -> None:
        self.id = "once"
        self.reply = reply
        self.on_call = on_call
        self.calls = 0

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        self.calls += 1
        if self.on_call is not None:
            self.on_call()
        return self.reply


@pytest.fixture
def pg_settings(pg_url: str, redis_url: str) -> Settings:
    return make_settings(pg_url, redis_url)


@pytest.fixture
def pg_worker(pg_settings: Settings) -> Iterator[object]:
    from workers.celery.embedded import EmbeddedWorker

    with EmbeddedWorker(pg_settings) as w:
        yield w


def test_a_commit_whose_postgresql_connection_is_dropped_is_sent_again_and_the_reply_kept(
    pg_settings: Settings, pg_worker: object, caplog: pytest.LogCaptureFixture
) -> None:
    # Given the server drops the worker's connection just as the step's commit is sent
    store = Store.open(pg_settings.database_url)
    admin = create_engine(pg_settings.database_url, isolation_level="AUTOCOMMIT")
    armed = threading.Event()
    dropped: list[int] = []

    def drop_connection(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if armed.is_set() and "ratchet_messages" in statement and "moved" in statement and not dropped:
            pid = conn.connection.dbapi_connection.info.backend_pid
            dropped.append(pid)
            with admin.connect() as c:
                c.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    event.listen(store.engine, "before_cursor_execute", drop_connection)
    model = Once(ModelReply(content="the answer"), on_call=armed.set)
    agent = Agent(name=f"transient-{uuid.uuid4().hex[:8]}", model=model)
    try:
        with caplog.at_level(logging.WARNING, logger="ratchet.store"):
            out = Client(pg_settings).start(agent.name, input="hello").wait(timeout=30)
    finally:
        event.remove(store.engine, "before_cursor_execute", drop_connection)
        admin.dispose()

    # Then the commit was sent again: the run completed with the one reply, the model called once
    assert dropped, "the fault never fired"
    assert out.status == S.COMPLETED, out.error
    assert out.content == "the answer" and model.calls == 1
    assert [m.role for m in out.messages] == ["user", "assistant"]
    assert any("transient database error" in r.getMessage() for r in caplog.records)


def test_a_commit_that_finds_sqlite_locked_waits_and_commits_once(
    tmp_path: Any, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from workers.celery.embedded import EmbeddedWorker

    # Given another connection holds SQLite's write lock when the step commits, past the busy timeout
    path = tmp_path / "ratchet.db"
    settings = make_settings(f"sqlite:///{path}", redis_url)
    store = Store.open(settings.database_url)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    step_thread: list[int] = []

    def hold_the_lock() -> None:
        holder.execute("BEGIN IMMEDIATE")
        step_thread.append(threading.get_ident())
        threading.Timer(1.0, lambda: holder.execute("COMMIT")).start()

    def short_busy_timeout(dbapi_conn: Any, *_: Any) -> None:
        # The step's connections give up on the lock after 0.1 s instead of 30 (the sweeper's wait).
        if threading.get_ident() in step_thread:
            dbapi_conn.execute("PRAGMA busy_timeout=100")

    event.listen(store.engine, "checkout", short_busy_timeout)
    model = Once(ModelReply(content="the answer"), on_call=hold_the_lock)
    agent = Agent(name=f"transient-{uuid.uuid4().hex[:8]}", model=model)
    try:
        # (The worker first: starting it sets up logging, which would drop caplog's handler.)
        with EmbeddedWorker(settings), caplog.at_level(logging.WARNING, logger="ratchet.store"):
            out = Client(settings).start(agent.name, input="hello").wait(timeout=30)
    finally:
        event.remove(store.engine, "checkout", short_busy_timeout)
        holder.close()

    assert out.status == S.COMPLETED, out.error
    assert out.content == "the answer" and model.calls == 1
    assert [m.role for m in out.messages] == ["user", "assistant"]
    assert any("database is locked" in r.getMessage() for r in caplog.records)


def test_only_connection_and_lock_errors_are_transient(tmp_path: Any, pg_url: str) -> None:
    from sqlalchemy.exc import DBAPIError

    def error_of(engine: Any, statement: str) -> DBAPIError:
        with pytest.raises(DBAPIError) as raised, engine.connect() as conn:
            conn.execute(text(statement))
        return raised.value

    lite = create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    pg = create_engine(pg_url)
    try:
        assert not is_transient(error_of(lite, "SELECT * FROM no_such_table"))
        assert not is_transient(error_of(pg, "SELECT * FROM no_such_table"))
        assert not is_transient(error_of(pg, "SELECT 1/0"))
        assert not is_transient(error_of(pg, "SELECT 'x'::varchar(1)::int"))
    finally:
        lite.dispose()
        pg.dispose()
