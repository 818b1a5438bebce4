"""kombu's Redis transport, with one flaw fixed (it builds a client object per message), and a
run's priority as it orders it. The embedded default's broker, a filesystem transport of
Ratchet's own, is in `workers.celery.filesystem`.

Redis.

kombu's Redis channel builds a new `redis.Redis` client for every message it publishes (and every
task event), which copies the client's ~170 response callbacks each time: about as long as the
publish's own round trip to Redis (redis-py 8.1, in our measurements). This channel keeps the first client kombu's
`conn_or_acquire` gives it, one per connection pool, and hands it out from then on; redis-py
clients are thread-safe (each command takes a connection from the pool). Used for `redis://`
brokers (see `workers.celery.app.celery_config`). It overrides no private name of kombu's:
`conn_or_acquire` and `pool` are public members of its Redis channel, and kombu's own builds the
client (with its key prefix and credential provider). Called after its connection was closed, it
fails with kombu's own AttributeError ('NoneType' object has no attribute 'hostname'), as kombu's
method does.

Priorities. kombu keeps a Redis list per queue and priority step (the queue's name, then
"\\x06\\x16" and the step; step 0 is the plain name) and a consumer's BRPOP names them in the
order of its `priority_steps` transport option, the lowest step first: on Redis a lower number is
more urgent, where RabbitMQ (with x-max-priority) serves a higher number first. Ratchet gives
kombu ten steps (`PRIORITY_STEPS`, in every Redis broker's transport options) and publishes a run's
priority p (0-9, higher first; none as 0) as `9 - p` (`message_priority`): a priority means the same
on both brokers, and kombu orders it with nothing of its own overridden. A step of priority 9 sits
in the queue's plain list, one of priority 0 (or none) in `<queue>\\x06\\x169`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

from orchestrator.validation import PRIORITY_MAX

TRANSPORT = "workers.celery.broker:Transport"
FILESYSTEM_TRANSPORT = "workers.celery.filesystem:FilesystemTransport"
#: The priority steps kombu's Redis transport keeps a list for (its `priority_steps` option),
#: served lowest first: one per priority.
PRIORITY_STEPS = list(range(PRIORITY_MAX + 1))
#: The brokers kombu serves with its Redis transport, whose priorities are `PRIORITY_STEPS`: its
#: aliases `redis`, `rediss` and `sentinel` (its `SentinelTransport`, a subclass), and `redis+socket`
#: (kombu reads `<transport>+<host>://`, here the Redis transport on a Unix socket).
REDIS_SCHEMES = ("redis://", "rediss://", "sentinel://", "redis+socket://")
#: What kombu's Redis transport puts between a queue's name and a priority step's in a list's name.
STEP_SEPARATOR: str = kombu_redis.Channel.sep


def queue_lists(queue: str) -> list[str]:
    """The Redis lists kombu keeps for a queue, one per priority step, in the order it serves them."""
    return [f"{queue}{STEP_SEPARATOR}{step}" if step else queue for step in PRIORITY_STEPS]


def message_priority(broker_url: str, priority: int | None) -> int | None:
    """The priority a step of a run of `priority` (0-9, higher first; None as 0) is published with:
    on Redis `9 - priority`, kombu's order (the lowest first); elsewhere the run's own."""
    if broker_url.startswith(REDIS_SCHEMES):
        return PRIORITY_MAX - (priority or 0)
    return priority


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
            with super().conn_or_acquire() as cached:  # kombu's: a new client on the channel's pool
                self._ratchet_client = cached
        yield cached


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above."""

    Channel = Channel
