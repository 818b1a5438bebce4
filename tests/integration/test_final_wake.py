"""Waiters on SQLite with a Redis broker are woken by the run's final move (announced on the
broker's pub/sub once its transaction committed), not only by their next poll: a real store file,
real Redis, a real worker. PostgreSQL needs none of this (LISTEN/NOTIFY, test_notify)."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import event as sa_event
from sqlalchemy import text

from orchestrator import Agent, Client, RunStatus, runtime
from orchestrator import client as client_module
from orchestrator.settings import Settings
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from workers.redis.finals import RedisFinals

S = RunStatus
pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
#: Set by the producer's first read of the run: the gate tool holds the run until then.
FIRST_READ = threading.Event()


def gate(q: str) -> str:
    """Wait until the producer has read the run once."""
    FIRST_READ.wait(10)
    return "open"


GATED = Agent(
    name="wake-gated",
    model=ScriptedModel(script=ScriptConfig(batches=[[{"tool": "gate", "arguments": {"q": "x"}}]])),
    tools=[gate],
)


@pytest.fixture
def no_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """`wait()` polls once a minute: only an announcement can end it within a test's timeout."""
    monkeypatch.setattr(client_module, "poll_delays", lambda: itertools.repeat(60.0))


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The runs `wait()` read (its polls of the store), and FIRST_READ set by the first."""
    from orchestrator.store.store import Store

    seen: list[str] = []
    original = Store.final_output

    def counted(self: Store, run_id: str) -> Any:
        out = original(self, run_id)
        seen.append(run_id)
        FIRST_READ.set()
        return out

    FIRST_READ.clear()
    monkeypatch.setattr(Store, "final_output", counted)
    yield seen


@pytest.mark.usefixtures("worker", "no_poll")
def test_a_waiter_is_woken_by_the_workers_final_commit_not_by_its_next_poll(
    settings: Settings, reads: list[str]
) -> None:
    client = Client(settings)
    run_id = client.start(GATED.name, input="hello").run_id

    out = client.wait(run_id, timeout=8)

    assert out.status == S.COMPLETED
    assert reads == [run_id]  # one poll, before the run ended: the announcement did the rest


@pytest.mark.usefixtures("no_poll")
def test_a_producers_cancel_wakes_a_waiter_in_another_thread(settings: Settings, reads: list[str]) -> None:
    client = Client(settings)
    run_id = client.start(GATED.name, input="hello").run_id  # no worker: it stays QUEUED

    def cancel_after_the_first_read() -> None:
        FIRST_READ.wait(10)
        client.cancel(run_id)

    canceller = threading.Thread(target=cancel_after_the_first_read)
    canceller.start()
    out = client.wait(run_id, timeout=8)
    canceller.join(10)

    assert out.status == S.CANCELLED and reads == [run_id]


def test_a_final_move_is_announced_once_committed_and_a_rolled_back_one_never(settings: Settings) -> None:
    client = Client(settings)
    heard: list[str] = []
    client.store.set_final_announcer(heard.extend)  # a recording announcer in place of Redis
    run_id = client.start(GATED.name, input="hello").run_id

    with pytest.raises(RuntimeError), client.store.engine.begin() as conn:
        moved = client.store.move(run_id, src=(S.QUEUED,), dst=S.CANCELLED, bump_epoch=True, conn=conn)
        assert moved is not None and heard == []  # not before the commit
        raise RuntimeError("rolled back")
    assert heard == [] and client.get_run(run_id).status == S.QUEUED

    client.cancel(run_id)
    assert heard == [run_id]


def test_a_waiter_whose_redis_is_gone_polls_at_once_without_waiting_for_a_subscription(settings: Settings) -> None:
    channel = RedisFinals(settings, f"redis://127.0.0.1:1/{uuid.uuid4().int % 16}")

    started = time.monotonic()
    assert channel.subscribe("some-run") is None
    assert channel.subscribe("some-run") is None  # the failure is remembered: no second attempt
    assert time.monotonic() - started < 2.0  # subscribe's own timeout: refused, not waited for
    with pytest.raises(redis.RedisError):  # the store logs it and goes on (notify.announce_after_commit)
        channel.announce(["some-run"])
    channel.announce(["some-run"])  # the failure is remembered: nothing sent, nothing raised


def test_an_exit_raised_inside_a_statement_on_sqlite_comes_out_as_itself(settings: Settings) -> None:
    # SystemExit is how a prefork pool process at its hard time limit leaves a statement; the
    # worker tells it from a tool's error by its type, so the store's listeners must not turn it
    # into PendingRollbackError while the connection is invalidated.
    store = Client(settings).store

    def interrupted(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "ratchet_exit_probe" in statement:
            raise SystemExit(3)

    sa_event.listen(store.engine, "before_cursor_execute", interrupted)
    try:
        with pytest.raises(SystemExit), store.engine.begin() as conn:
            conn.execute(text("SELECT 'ratchet_exit_probe'"))
    finally:
        sa_event.remove(store.engine, "before_cursor_execute", interrupted)


def test_a_payload_that_is_no_run_id_on_the_channel_does_not_stop_its_listener(settings: Settings) -> None:
    channel = runtime.current(settings).finals
    assert channel is not None
    event = channel.subscribe("run-heard-after-garbage")
    assert event is not None

    redis.Redis.from_url(settings.broker_url).publish("ratchet:final", b"\xff\xfe not utf-8")  # anyone can
    channel.announce(["run-heard-after-garbage"])

    assert event.wait(5)
    assert channel.listening  # a listener that died on the bytes would wake everyone, then stop
