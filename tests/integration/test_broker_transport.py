"""`workers/broker.py` overrides `conn_or_acquire`, a private method of kombu's Redis channel, and
pyproject.toml bounds kombu to the series it was checked against. These tests fail loudly when a
kombu upgrade moves what the override relies on: the method and its signature, what the override
calls in its place, and the override being on the path Celery publishes through."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from kombu.transport import redis as kombu_redis

from orchestrator.ports import StepRef
from tests.conftest import make_settings
from workers import broker
from workers.dispatch import CeleryDispatcher

POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
EMPTY = inspect.Parameter.empty


def shape(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """A signature without its annotations: names, kinds and defaults."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_kombus_redis_channel_still_has_what_the_override_relies_on() -> None:
    base = kombu_redis.Channel
    # The method overridden: a generator-based context manager taking an optional client.
    assert shape(base.conn_or_acquire) == [("self", POSITIONAL, EMPTY), ("client", POSITIONAL, None)]
    assert inspect.isgeneratorfunction(inspect.unwrap(base.conn_or_acquire))
    assert shape(broker.Channel.conn_or_acquire) == shape(base.conn_or_acquire)
    # What the override calls in its place: a client built on the channel's pool.
    assert shape(base._create_client) == [("self", POSITIONAL, EMPTY), ("asynchronous", POSITIONAL, False)]
    assert isinstance(inspect.getattr_static(base, "pool"), property)
    assert broker.Transport.Channel is broker.Channel
    assert issubclass(broker.Transport, kombu_redis.Transport)


def test_celery_publishes_every_step_through_one_client_on_a_real_redis_channel(redis_url: str, tmp_path: Path) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    dispatcher = CeleryDispatcher(settings)
    try:
        # When two steps are published the way the engine publishes them
        dispatcher.publish(StepRef(run_id="run-a", seq=0, kind="model"))
        with dispatcher.app.producer_or_acquire() as producer:
            channel = producer.channel
            first = channel._ratchet_client
        dispatcher.publish(StepRef(run_id="run-a", seq=1, kind="model"))

        # Then both went through the override, which built one client on the channel's pool
        assert isinstance(channel, broker.Channel)
        assert first is not None and first.connection_pool is channel.pool
        assert channel._ratchet_client is first
        with redis.Redis.from_url(redis_url) as client:
            assert client.llen(settings.model_queue) == 2
    finally:
        dispatcher.app.close()
