"""Model faults through a whole run on a real worker (threads pool, Redis broker), on SQLite and
PostgreSQL: a reply that trickles in is a retried timeout, and a key no header can carry ends the
run at once without the key reaching a log record, a row, or anything that crosses Redis.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import MetaData, select

from orchestrator import Agent, Client, RetryPolicy, RunStatus
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings
from workers.celery.embedded import EmbeddedWorker

QUICK_RETRIES = RetryPolicy(base=0.05, factor=2.0, max_delay=0.1)


def define(settings: Settings, **kwargs: Any) -> Agent:
    return Agent(
        name=f"mf-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="gpt-4o-mini"), client=Client(settings), **kwargs
    )


def test_a_reply_that_trickles_in_is_a_timeout_each_try_and_the_run_ends_in_error_naming_it(
    db_url: str, redis_url: str, scripted: ScriptedServer
) -> None:
    # Given replies that trickle in for much longer than the worker's 1 s model timeout
    settings = make_settings(db_url, redis_url, model_timeout=1)
    scripted.configure(ScriptConfig(tool_batches=0, trickle_s=0.05))
    agent = define(settings, retries=1, retry_policy=QUICK_RETRIES)

    # When the run goes on a worker
    with EmbeddedWorker(settings):
        out = agent.run("hello", timeout=20)

    # Then each try timed out, the timeout was retried, and the run is in ERROR naming it
    assert out.status == RunStatus.ERROR and out.error is not None
    assert out.error.type == "APITimeoutError" and "within 1s" in out.error.message
    assert len(scripted.requests_for(out.run_id)) == 1 + agent.retries
    retries = [e for e in Client(settings).store.get_events(out.run_id) if e["kind"] == "retry"]
    assert [e["detail"]["error"]["type"] for e in retries] == ["APITimeoutError"]


class BrokerTap:
    """Every message published on the Redis server while it runs (PSUBSCRIBE '*')."""

    def __init__(self, url: str) -> None:
        self._pubsub = redis.Redis.from_url(url).pubsub()
        self.messages: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="broker-tap", daemon=True)

    def __enter__(self) -> BrokerTap:
        self._pubsub.psubscribe("*")
        # Subscribed once the server confirms: nothing published after this point is missed.
        wait_until(lambda: self._pubsub.get_message(timeout=0.1), timeout=5, what="the subscription")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pubsub.close()

    def find(self, *words: str) -> list[str]:
        """The messages, decoded, that hold all these words."""
        return [text for text in map(decoded, list(self.messages)) if all(w in text for w in words)]

    def _listen(self) -> None:
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.05)
            if message is not None and message["type"] == "pmessage":
                self.messages.append(message["data"])


def decoded(raw: bytes) -> str:
    """A kombu message as text, with its base64 body decoded too."""
    text = raw.decode("utf-8", "replace")
    try:
        envelope = json.loads(text)
    except ValueError:
        return text
    if isinstance(envelope, dict) and isinstance(envelope.get("body"), str):
        try:
            text += "\n" + base64.b64decode(envelope["body"]).decode("utf-8", "replace")
        except ValueError:
            pass
    return text


def redis_texts(url: str) -> Iterator[str]:
    """Every key and value in the broker's Redis database."""
    r = redis.Redis.from_url(url)
    for key in r.scan_iter(count=1000):
        kind = r.type(key).decode()
        values: list[Any] = []
        if kind == "string":
            values = [r.get(key)]
        elif kind == "list":
            values = r.lrange(key, 0, -1)
        elif kind == "hash":
            values = [*r.hgetall(key).items()]
        elif kind == "set":
            values = [*r.smembers(key)]
        elif kind == "zset":
            values = [m for m, _ in r.zrange(key, 0, -1, withscores=True)]
        yield key.decode("utf-8", "replace")
        for value in values:
            yield decoded(value) if isinstance(value, bytes) else str(value)


def store_texts(database_url: str) -> Iterator[str]:
    """Every value of every column of every table of the run store."""
    engine = Store.open(database_url).engine
    tables = MetaData()
    tables.reflect(engine)
    with engine.connect() as conn:
        for table in tables.sorted_tables:
            for row in conn.execute(select(table)):
                yield from (str(value) for value in row)


@pytest.mark.parametrize("problem", ["non-ascii", "newline"])
def test_a_key_no_header_can_carry_ends_the_run_at_once_and_reaches_no_log_row_or_broker(
    db_url: str,
    redis_url: str,
    scripted: ScriptedServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    problem: str,
) -> None:
    # Given a key with a character an HTTP header cannot carry; `marker` is in every form of it
    marker = uuid.uuid4().hex
    key = f"sk-proj-{marker}\u00e9x" if problem == "non-ascii" else f"sk-proj-{marker}\n"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    settings = make_settings(db_url, redis_url)
    agent = define(settings, retries=3, retry_policy=QUICK_RETRIES)
    caplog.set_level(logging.DEBUG)

    # When a run goes on a worker, with every Redis publication tapped
    with BrokerTap(redis_url) as tap, EmbeddedWorker(settings):
        out = agent.run("hello", timeout=20)
        # Celery sends task-failed after the failure handler has stored the error.
        wait_until(lambda: tap.find("task-failed", out.run_id), timeout=10, what="the task-failed event")

    # Then the run is in ERROR at once with a final error that says what to fix
    assert out.status == RunStatus.ERROR and out.error is not None
    assert out.error.type == "AuthenticationError" and "OPENAI_API_KEY" in out.error.message
    assert scripted.requests_for(out.run_id) == []
    assert [e for e in Client(settings).store.get_events(out.run_id) if e["kind"] == "retry"] == []
    # And the key is nowhere: not in a log record, a row, a message on Redis, or a Redis key
    texts = {
        "logs": [caplog.text],
        "store": list(store_texts(settings.database_url)),
        "broker messages": [decoded(m) for m in tap.messages],
        "redis": list(redis_texts(redis_url)),
    }
    leaks = {where: [t for t in found if marker in t.lower()] for where, found in texts.items()}
    assert leaks == {where: [] for where in texts}
    assert texts["broker messages"] and texts["store"]
