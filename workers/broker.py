"""kombu's Redis transport, minus a client object built per message.

kombu's Redis channel builds a new `redis.Redis` client for every message it publishes (and every
task event), which copies the client's ~200 response callbacks each time: about 40% of a
publish in our measurements. This channel keeps one client per connection pool; redis-py
clients are thread-safe (each command takes a connection from the pool). Used for `redis://`
brokers (see `workers.app.celery_config`).

`conn_or_acquire` is private to kombu: pyproject.toml holds kombu to the minor series that
tests/integration/test_broker_transport.py passed on. Called after its connection was closed,
it fails with kombu's own AttributeError ('NoneType' object has no attribute 'hostname', from
`_connparams` building a new pool), exactly as kombu's method does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

TRANSPORT = "workers.broker:Transport"


class Channel(kombu_redis.Channel):
    """A Redis channel that reuses its publishing client."""

    _ratchet_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        cached = self._ratchet_client
        if cached is None or cached.connection_pool is not self.pool:
            cached = self._ratchet_client = self._create_client()  # type: ignore[no-untyped-call]
        yield cached


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above."""

    Channel = Channel
