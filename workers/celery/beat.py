"""Beat's schedule, with a record of when it last sent the sweep: what `ratchet health --check
beat` reads, since beat answers no control command (it has no mailbox) and writes nothing else
anyone can see.

Beat is optional: every worker sweeps by itself (`orchestrator.sweeping`). A deployment that
wants the sweep sent from one process of its own runs `ratchet beat` and sets
RATCHET_WORKER_SWEEPS=false on its workers; the `ratchet.sweep` it sends takes the same sweep
lease as the workers' sweepers, so the two never sweep at once.

On a Redis broker, each time beat sends `ratchet.sweep` it sets `ratchet:beat:<control queue>`
to the time (UNIX seconds), with an expiry of a day: one SET every RATCHET_SWEEP_SECONDS. The key
names the control queue, so deployments that share a Redis under other queue names keep their own
records. Other brokers keep no record. A record that cannot be written is logged and the schedule
goes on: the record is for monitoring, the sweep is what matters.

`workers.celery.app.celery_config` makes this beat's scheduler (Celery's `beat_scheduler`), so
`ratchet beat` and `celery -A workers.celery.app beat` both keep the record.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from celery.beat import PersistentScheduler

from orchestrator.settings import Settings
from workers.celery.app import BROKER_CONNECT_TIMEOUT, BROKER_SOCKET_TIMEOUT, SWEEP_TASK

SCHEDULER = "workers.celery.beat:Scheduler"
KEY = "ratchet:beat:{queue}"
#: How long a record outlives beat (seconds): a stopped beat's record goes stale, then goes.
RECORD_TTL = 86_400
log = logging.getLogger("ratchet.beat")


def record_key(settings: Settings) -> str:
    """The Redis key of beat's last sweep sent for these settings' control queue."""
    return KEY.format(queue=settings.control_queue)


def broker_redis(settings: Settings, timeout: float = BROKER_SOCKET_TIMEOUT) -> redis.Redis | None:
    """A client of the broker's Redis (None on another broker), bounded as the broker's is."""
    if not settings.broker_url.startswith(("redis://", "rediss://")):
        return None
    return redis.Redis.from_url(
        settings.broker_url, socket_timeout=timeout, socket_connect_timeout=min(timeout, BROKER_CONNECT_TIMEOUT)
    )


def last_sweep_sent(client: redis.Redis, settings: Settings) -> float | None:
    """When beat last sent the sweep (UNIX seconds), or None if no record is there."""
    raw = client.get(record_key(settings))
    return float(raw) if raw is not None else None


class Scheduler(PersistentScheduler):  # type: ignore[misc]  # Celery is untyped
    """Celery's persistent scheduler that records each sweep it sends (see the module docstring)."""

    _client: redis.Redis | None = None

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        result = super().apply_async(entry, producer, advance, **kwargs)
        if entry.task == SWEEP_TASK:
            self._record()
        return result

    def _record(self) -> None:
        settings: Settings | None = getattr(self.app, "ratchet_settings", None)
        if settings is None:
            return
        try:
            if self._client is None:
                self._client = broker_redis(settings)
            if self._client is not None:
                self._client.set(record_key(settings), repr(time.time()), ex=RECORD_TTL)
        except redis.RedisError as exc:
            log.warning("could not record the sweep sent in Redis (ratchet health --check beat reads it): %s", exc)
