"""The domain's ports: how it asks for a step to run, without knowing about Celery, where a
streamed run's live events go, and where the limits every worker shares are kept, without
knowing about Redis.

`workers.celery.dispatch.CeleryDispatcher` implements the broker port; the setting RATCHET_DISPATCHER
names the implementation, which is imported by name the first time a step is published, so
importing `orchestrator` never imports Celery. The delta sink is `workers.redis.delta_sink.RedisDeltaSink`
when the broker is Redis (imported by name, likewise), else a table of the run store. The
limiter is `workers.redis.limiter.RedisLimiter` when RATCHET_LIMITER_URL or the broker names a Redis,
else `orchestrator.limits.LocalLimiter`, which each process keeps for itself.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from orchestrator.errors import ConfigurationError
from orchestrator.settings import Settings

if TYPE_CHECKING:
    from orchestrator.events import RunEvent
    from orchestrator.models.base import RateLimit
    from orchestrator.store import Store

StepKind = Literal["model", "tools"]


@dataclass(frozen=True, kw_only=True)
class StepRef:
    """One step to run: only ids cross the broker. `countdown` delays delivery (short waits only).

    Where it goes and in which order are `orchestrator.routing`'s: `queue` names the queue its
    agent or tool asked for (None: the default queue of its kind, RATCHET_MODEL_QUEUE or
    RATCHET_TOOLS_QUEUE); `priority` is its run's, 0-9, higher first (None: none, as 0).
    `routed` is False when the publisher does not define the run's agent and so could not tell
    its queue: the step goes to the default queue, and the worker that takes it sends it on to
    its agent's queue if that names one."""

    run_id: str
    seq: int
    kind: StepKind
    countdown: float | None = None
    queue: str | None = None
    priority: int | None = None
    routed: bool = True


class Dispatcher(Protocol):
    """Publishes steps to workers."""

    def publish(self, step: StepRef) -> None:
        """Send the step's task. Raise on failure; the run's outbox marker makes it safe to."""
        ...


@runtime_checkable
class QueueLengths(Protocol):
    """A dispatcher that can say how many steps wait in its queues (for `Client.metrics`)."""

    def queue_lengths(self) -> dict[str, int]:
        """Messages waiting in each queue, by queue name. Raise if the broker cannot be asked."""
        ...


_lock = threading.Lock()
# Keyed by the whole (frozen) settings: two settings on one broker may name different queues.
_dispatchers: dict[Settings, Dispatcher] = {}


def get_dispatcher(settings: Settings) -> Dispatcher:
    """The process's dispatcher for these settings, built once from RATCHET_DISPATCHER."""
    key = settings
    with _lock:
        found = _dispatchers.get(key)
        if found is None:
            module_name, _, attr = settings.dispatcher.partition(":")
            try:
                factory = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise ConfigurationError(
                    f"RATCHET_DISPATCHER={settings.dispatcher!r} cannot be imported ({exc}); "
                    "install ratchet with its workers package or name a module:Class"
                ) from None
            found = factory(settings)
            _dispatchers[key] = found
        return found


def set_dispatcher(settings: Settings, dispatcher: Dispatcher | None) -> None:
    """Use this dispatcher for these settings in this process (the embedded worker does); None
    forgets it (the next `get_dispatcher` builds one from RATCHET_DISPATCHER again)."""
    with _lock:
        if dispatcher is None:
            _dispatchers.pop(settings, None)
        else:
            _dispatchers[settings] = dispatcher


class DeltaSink(Protocol):
    """Carries a streamed run's live events (RunContent deltas, StepRestarted) from the worker
    that makes them to every reader. Only runs started with stream=True write to it."""

    def write(self, event: RunEvent) -> None:
        """Append one live event of `event.run_id`; its id is higher than the step's earlier ones.
        It may be stored later, in the order written, but by the next `flush` of its run."""
        ...

    def read(self, run_id: str, cursor: str | None) -> tuple[list[RunEvent], str | None]:
        """The run's live events written after `cursor` (None: from the first kept), in the
        order written, and the cursor to pass next time."""
        ...

    def wait(self, run_id: str, cursor: str | None, timeout: float) -> tuple[list[RunEvent], str | None]:
        """Return once the run may have live events after `cursor`, or after `timeout` seconds: a
        reader's wait between polls, woken by a delta at once where the sink can block on one.
        Returns what it read on the way, as `read` does (a sink that only sleeps: none, and
        `cursor`), so a reader woken by a delta need not read the sink again."""
        ...

    def discard(self, run_ids: Sequence[str]) -> None:
        """Forget the live events of these runs (deleted from the store). A sink that cannot
        reach its server logs it and returns: what it keeps expires after RATCHET_STREAM_TTL."""
        ...

    def flush(self, run_id: str) -> None:
        """Return once every event of the run this process wrote is stored (or given up on). A
        step calls it at the end of its model call, before its commit: the reader's id rule
        (`orchestrator.reader`) needs every delta stored before a durable event sorting above it."""
        ...


#: The delta sink of a Redis broker, imported by name (the domain does not import Redis).
REDIS_SINK = "workers.redis.delta_sink:RedisDeltaSink"
_sinks: dict[Settings, DeltaSink] = {}


def get_delta_sink(settings: Settings, store: Store) -> DeltaSink:
    """The delta sink for these settings: a Redis stream per run when the broker is Redis (one
    client per process and settings), else the `ratchet_deltas` table of `store` (no server)."""
    if not settings.broker_url.startswith(("redis://", "rediss://")):
        from orchestrator.store.deltas import TableDeltaSink

        return TableDeltaSink(store, ttl=settings.stream_ttl)
    with _lock:
        found = _sinks.get(settings)
        if found is None:
            module_name, _, attr = REDIS_SINK.partition(":")
            found = _sinks[settings] = getattr(importlib.import_module(module_name), attr)(settings)
        return found


class FinalChannel(Protocol):
    """Wakes waiters when a run stops, where the database cannot (SQLite): the store announces
    each final move after its commit, and `Client.wait` wakes on it between its polls. Best
    effort: a lost announcement costs a waiter its next poll's delay, nothing more."""

    def announce(self, run_ids: list[str]) -> None:
        """Say that these runs reached a final status (their moves committed)."""
        ...

    def subscribe(self, run_id: str) -> threading.Event | None:
        """An event set when the run is announced; None if announcements cannot be received now."""
        ...

    def unsubscribe(self, run_id: str, event: threading.Event) -> None:
        """Stop setting `event` for the run."""
        ...


#: The final channel of a Redis broker, imported by name.
REDIS_FINALS = "workers.redis.finals:RedisFinals"
_channels: dict[str, FinalChannel] = {}


def get_final_channel(settings: Settings) -> FinalChannel | None:
    """Redis pub/sub on the broker's Redis (one per process and broker); None for other brokers."""
    if not settings.broker_url.startswith(("redis://", "rediss://")):
        return None
    with _lock:
        found = _channels.get(settings.broker_url)
        if found is None:
            module_name, _, attr = REDIS_FINALS.partition(":")
            found = _channels[settings.broker_url] = getattr(importlib.import_module(module_name), attr)(settings)
        return found


def wire_finals(settings: Settings, store: Store) -> FinalChannel | None:
    """For a store that cannot notify waiters itself (SQLite): have it announce final moves on
    the broker's channel, and return that channel for waiters (None where there is none)."""
    if not store.announces_finals:
        return None
    channel = get_final_channel(settings)
    if channel is not None:
        store.set_final_announcer(channel.announce)
    return channel


# ---------------------------------------------------------------- flow control


@dataclass(frozen=True, kw_only=True)
class Ask:
    """What a model step asks of the limiter before its call (`orchestrator.limits`)."""

    run_id: str
    #: The run's concurrency key, and the most runs of that key in progress at once (0: none).
    key: str | None = None
    limit: int = 0
    #: The model's limits and the id they are kept under (None: not limited), and the tokens
    #: the call is estimated at.
    model: str | None = None
    rate: RateLimit | None = None
    tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """The limiter's answer: go (`reason` None), or wait about `wait` seconds, because of
    "concurrency" (the key's runs are all in progress), "requests" or "tokens" (the model's
    rates), or "blocked" (the provider said 429)."""

    wait: float = 0.0
    reason: str | None = None

    @property
    def admitted(self) -> bool:
        return self.reason is None


@dataclass(frozen=True, kw_only=True)
class Place:
    """A place a run holds among its key's runs, as the limiter lists it (`Limiter.held`)."""

    key: str
    run_id: str
    #: When it expires unless renewed, on the limiter's own clock: `Limiter.free` frees it only
    #: while it still has this stamp, so a run whose next step renewed it meanwhile keeps it.
    until: float


class Limiter(Protocol):
    """Keeps the limits every worker shares: runs in progress per key, and each model's rates.
    An implementation that cannot reach its server logs it and lets the step go (fails open)."""

    def admit(self, ask: Ask) -> Verdict:
        """All or nothing: the run's place among its key's runs, one request and the call's
        tokens, or none of them and how long to wait. A run that holds its place keeps it
        (renewed for RATCHET_RUN_SLOT_SECONDS) whatever the verdict."""
        ...

    def wait_for_room(self, key: str, limit: int, step: StepRef) -> bool:
        """Keep `step` (a run parked for want of room) to be published when a run of `key` ends,
        highest priority first, then first parked. True when there is room already: its place
        is taken for it, and the caller publishes it now."""
        ...

    def release(self, run_id: str, limit: int) -> StepRef | None:
        """The run ended or paused: free its place (or forget it among the waiting), and give
        that place to the next run waiting for one; returns that run's step, to publish."""
        ...

    def held(self) -> list[Place]:
        """Every place held now, of every key: what the sweeper checks against the store, to free
        those of runs that ended while a release could not reach the limiter (empty then too)."""
        ...

    def free(self, place: Place, limit: int) -> tuple[bool, StepRef | None]:
        """Free `place` as `release` would, if it is still held as `held` listed it (a place
        renewed since is kept); whether it was freed, and the step of the run that takes it."""
        ...

    def settle(self, model: str, rate: RateLimit, tokens: int) -> None:
        """Correct a call's token estimate by what it used besides (negative: less). It may be
        counted at this process's next `admit` of the model, in that round trip."""
        ...

    def block(self, model: str, seconds: float) -> None:
        """The provider answered 429: no call of `model` for `seconds`, on any worker."""
        ...


#: The limiter on Redis, imported by name (the domain does not import Redis).
REDIS_LIMITER = "workers.redis.limiter:RedisLimiter"
_limiters: dict[Settings, Limiter] = {}
#: Its own lock: a dispatcher built under `_lock` may install a limiter (the in-memory one does).
_limiters_lock = threading.Lock()
log = logging.getLogger("ratchet.flow")


def get_limiter(settings: Settings) -> Limiter:
    """The process's limiter for these settings: on RATCHET_LIMITER_URL's Redis, else on the
    broker's when it is Redis, else one of this process's own (not shared: said in a warning
    unless the broker needs no server either)."""
    with _limiters_lock:
        found = _limiters.get(settings)
        if found is not None:
            return found
        url = settings.limiter_url
        if url is None and settings.broker_url.startswith(("redis://", "rediss://")):
            url = settings.broker_url
        if url is not None:
            module_name, _, attr = REDIS_LIMITER.partition(":")
            found = getattr(importlib.import_module(module_name), attr)(settings, url)
        else:
            from orchestrator.limits import LocalLimiter

            if not settings.is_embedded_broker:
                log.warning(
                    "flow control: limits are kept in each process, not shared by the workers: set "
                    "RATCHET_LIMITER_URL to a Redis to share them"
                )
            found = LocalLimiter(slot_seconds=settings.run_slot_seconds)
        _limiters[settings] = found
        return found


def set_limiter(settings: Settings, limiter: Limiter | None) -> None:
    """Use this limiter for these settings in this process (`in_memory` does); None forgets it."""
    with _limiters_lock:
        if limiter is None:
            _limiters.pop(settings, None)
        else:
            _limiters[settings] = limiter
