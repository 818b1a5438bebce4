"""Waking waiters on SQLite through Redis (RATCHET_REDIS_URL): one pub/sub channel, `ratchet:final`.

The store announces each run's final move once its transaction committed (PUBLISH of the run
id); one subscriber thread per process wakes the threads `Client.wait`s of that run. Pub/sub
keeps nothing: an announcement nobody hears is gone, and a waiter that misses one finds the run
stopped at its next poll. PostgreSQL does not need this (LISTEN/NOTIFY, `orchestrator.store.notify`).
"""

from __future__ import annotations

import time
from typing import Any

import redis

from orchestrator.settings import Settings
from orchestrator.store.notify import RETRY_AFTER_FAILURE, Listener
from workers.celery.app import BROKER_CONNECT_TIMEOUT, BROKER_SOCKET_TIMEOUT

CHANNEL = "ratchet:final"


class RedisFinals(Listener):
    """A `FinalChannel` (orchestrator.ports) on the Redis at `url` (RATCHET_REDIS_URL). Thread-safe."""

    thread_name = "ratchet-finals"

    def __init__(self, settings: Settings, url: str) -> None:
        super().__init__()
        self.url = url
        self.client = redis.Redis.from_url(
            self.url, socket_timeout=BROKER_SOCKET_TIMEOUT, socket_connect_timeout=BROKER_CONNECT_TIMEOUT
        )
        self._down_until = 0.0

    def announce(self, run_ids: list[str]) -> None:
        """PUBLISH each run id, in one round trip. After a failure, nothing is sent for
        RETRY_AFTER_FAILURE seconds: a Redis that hangs must not cost every final commit a timeout."""
        if self._down_until > time.monotonic():
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for run_id in run_ids:
                pipe.publish(CHANNEL, run_id)
            pipe.execute()
        except (redis.RedisError, OSError):
            self._down_until = time.monotonic() + RETRY_AFTER_FAILURE
            raise

    def _receive(self) -> None:
        # No socket timeout on the subscriber: it blocks in get_message's own timeout.
        pubsub: Any = redis.Redis.from_url(self.url, socket_connect_timeout=BROKER_CONNECT_TIMEOUT).pubsub()  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(CHANNEL)
            while not self.closed:
                message = pubsub.get_message(timeout=1.0)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    self._ready()
                elif message["type"] == "message":  # anyone can publish here: bytes that are no run id wake no one
                    data = message["data"]
                    self._heard(data.decode(errors="replace") if isinstance(data, bytes) else str(data))
        finally:
            pubsub.close()
