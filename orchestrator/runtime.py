"""The runtime: one process's parts, built once from its settings (the composition root).

A `Runtime` holds what a process needs to start, run and read runs: its settings, the run store,
the dispatcher steps are published through, the delta sink of streamed runs, the limiter of flow
control, and the channel that wakes waiters when a run stops where the store cannot (SQLite).
`Client`, `StepRunner` (and through it the sweeper and the heartbeat), the workers, the HTTP API
and the CLI are handed one; `current(settings)` is the process's, which `Client()` takes when it
is given nothing (an `Agent(...).run("hi")` script, with the environment's settings).

Which implementation each part gets is read off the settings, never guessed from a URL:

- the dispatcher: RATCHET_DISPATCHER names an installed one (entry point group
  `ratchet.dispatchers`; Ratchet's is `celery`), or is the `module:Class` of your own, built
  with the settings (`orchestrator.testing:InMemoryDispatcher` runs every step inline);
- the delta sink and the final channel: on RATCHET_REDIS_URL's Redis when it is set (entry
  points `deltas` and `finals` of group `ratchet.redis`), else the store's `ratchet_deltas`
  table and no channel (waiters poll);
- the limiter: on RATCHET_LIMITER_URL's Redis when it is set (`limiter` of `ratchet.redis`),
  else a `LocalLimiter` of this process, not shared (said in a warning unless the broker needs
  no server either).

The adapters live in `workers/`, which the domain never imports: Ratchet's package declares them
as entry points (pyproject.toml), loaded when a runtime first needs one, so importing
`orchestrator` loads neither Celery nor Redis.

The process's caches are kept here: one dispatcher, Redis delta sink and limiter per settings
(two settings on one broker may name different queues), one final channel per Redis URL (one
subscriber thread), and the store `Store.open` keeps per URL. `install` makes a runtime the
process's for its settings (`in_memory` and the embedded worker do); a part it holds is what
every runtime then built for those settings gets, unless given another.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from orchestrator import tracing
from orchestrator.errors import ConfigurationError
from orchestrator.limits import LocalLimiter
from orchestrator.ports import DeltaSink, Dispatcher, FinalChannel, Limiter
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.table_sink import TableDeltaSink

#: The entry point group of dispatchers, named by RATCHET_DISPATCHER.
DISPATCHERS = "ratchet.dispatchers"
#: The entry point group of the Redis adapters (`deltas`, `finals`, `limiter`), each built with
#: the settings and its Redis URL.
REDIS = "ratchet.redis"

log = logging.getLogger("ratchet.limiter")


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """The parts of one process for one Settings."""

    settings: Settings
    store: Store
    dispatcher: Dispatcher
    deltas: DeltaSink
    limiter: Limiter
    #: Where the store announces final moves and waiters hear of them, where it cannot notify
    #: them itself (SQLite with RATCHET_REDIS_URL); None elsewhere.
    finals: FinalChannel | None = None


# One lock, re-entrant: a dispatcher built here may build a runtime of its own (the in-memory one).
_lock = threading.RLock()
_installed: dict[Settings, Runtime] = {}
_built: dict[Settings, Runtime] = {}
_dispatchers: dict[Settings, Dispatcher] = {}
_sinks: dict[Settings, DeltaSink] = {}
_limiters: dict[Settings, Limiter] = {}
_channels: dict[str, FinalChannel] = {}
_factories: dict[tuple[str, str], Callable[..., Any]] = {}


def current(settings: Settings | None = None) -> Runtime:
    """The process's runtime for these settings (default: the environment's): the one installed
    for them, else one built on first use and kept while its store is the process's (a fork, or a
    test, that forgets the stores gets a new one)."""
    settings = settings or Settings.from_env()
    with _lock:
        found = _installed.get(settings)
        if found is not None:
            return found
        store = open_store(settings)
        found = _built.get(settings)
        if found is None or found.store is not store:
            found = _built[settings] = _process_runtime(settings, store)
        return found


def _process_runtime(settings: Settings, store: Store) -> Runtime:
    """A dispatcher that runs steps in this process (the in-memory one, named in the settings)
    brings the runtime its steps run on: its producers share it, and so its store and limiter."""
    for _ in range(2):
        dispatcher = _dispatcher(settings)
        brought = getattr(dispatcher, "runtime", None)
        if not isinstance(brought, Runtime):
            break
        if brought.settings == settings and brought.store is store:
            return brought
        _dispatchers.pop(settings, None)  # built on a store since forgotten: build it again
    return build(settings, store=store, dispatcher=dispatcher)


def build(
    settings: Settings,
    *,
    store: Store | None = None,
    dispatcher: Dispatcher | None = None,
    limiter: Limiter | None = None,
) -> Runtime:
    """A runtime for these settings with the parts given, and the process's others (as
    `current` has them): what a worker brings its own dispatcher to, or a test its own store."""
    with _lock:
        store = store if store is not None else open_store(settings)
        tracing.stamp_log_records()  # every `ratchet.*` record has `trace_id`, even before a step
        if tracing.available():  # each run's span is emitted where its stop commits
            store.stops.observe(tracing.stopped)
        return Runtime(
            settings=settings,
            store=store,
            dispatcher=dispatcher if dispatcher is not None else _dispatcher(settings),
            deltas=_deltas(settings, store),
            limiter=limiter if limiter is not None else _limiter(settings),
            finals=_finals(settings, store),
        )


def install(runtime: Runtime) -> Runtime | None:
    """Make `runtime` the process's for its settings (every `Client` of those settings uses it);
    returns the one it replaced, if any, for `uninstall`."""
    with _lock:
        previous = _installed.get(runtime.settings)
        _installed[runtime.settings] = runtime
        return previous


def uninstall(runtime: Runtime, previous: Runtime | None = None) -> None:
    """Undo `install(runtime)`: `previous` is the process's again (None: none installed)."""
    with _lock:
        if _installed.get(runtime.settings) is runtime:
            if previous is None:
                del _installed[runtime.settings]
            else:
                _installed[runtime.settings] = previous


def forget() -> None:
    """Drop the runtimes this process built or installed (a forked child builds its own, on
    stores of its own: call it with `forget_stores`). The adapters stay: each survives a fork."""
    with _lock:
        _installed.clear()
        _built.clear()


def open_store(settings: Settings) -> Store:
    """The process's store for the settings' database (`Store.open`: one per URL)."""
    return Store.open(
        settings.database_url, auto_migrate=settings.auto_migrate, sqlite_synchronous=settings.sqlite_synchronous
    )


# ---------------------------------------------------------------- the parts


def _dispatcher(settings: Settings) -> Dispatcher:
    """The installed runtime's dispatcher, else RATCHET_DISPATCHER's, built once per settings."""
    if (installed := _installed.get(settings)) is not None:
        return installed.dispatcher
    found = _dispatchers.get(settings)
    if found is None:
        factory = adapter(DISPATCHERS, settings.dispatcher, hint="or set RATCHET_DISPATCHER to a module:Class")
        found = _dispatchers[settings] = factory(settings)
    return found


def _deltas(settings: Settings, store: Store) -> DeltaSink:
    """A stream per run on RATCHET_REDIS_URL (one client per settings), else the store's table."""
    if settings.redis_url is None:
        return TableDeltaSink(store, ttl=settings.stream_ttl)
    found = _sinks.get(settings)
    if found is None:
        found = _sinks[settings] = adapter(REDIS, "deltas", hint=_NO_REDIS)(settings, settings.redis_url)
    return found


def _finals(settings: Settings, store: Store) -> FinalChannel | None:
    """For a store that cannot notify waiters itself (SQLite): pub/sub on RATCHET_REDIS_URL (one
    per URL), on which the store announces its final moves; None without that Redis, or with a
    store that notifies (PostgreSQL)."""
    if not store.announces_finals or settings.redis_url is None:
        return None
    url = settings.redis_url
    found = _channels.get(url)
    if found is None:
        found = _channels[url] = adapter(REDIS, "finals", hint=_NO_REDIS)(settings, url)
    store.set_final_announcer(found.announce)
    return found


def _limiter(settings: Settings) -> Limiter:
    """The installed runtime's limiter, else one per settings: on RATCHET_LIMITER_URL's Redis, or
    this process's own."""
    if (installed := _installed.get(settings)) is not None:
        return installed.limiter
    found = _limiters.get(settings)
    if found is None:
        if settings.limiter_url is not None:
            found = adapter(REDIS, "limiter", hint=_NO_REDIS)(settings, settings.limiter_url)
        else:
            if not settings.is_embedded_broker and settings.max_runs_per_key is not None:
                log.warning(
                    "limiter: limits are kept in each process, not shared by the workers: set "
                    "RATCHET_REDIS_URL (or RATCHET_LIMITER_URL) to a Redis to share them"
                )
            found = LocalLimiter(slot_seconds=settings.run_slot_seconds)
        _limiters[settings] = found
    return found


_NO_REDIS = "or unset RATCHET_REDIS_URL and RATCHET_LIMITER_URL to keep what they carry in the store and the process"


def adapter(group: str, name: str, *, hint: str) -> Callable[..., Any]:
    """The factory `name` of the entry point `group` (loaded once per process), or the object a
    `module:attr` name gives. ConfigurationError saying what to do when there is none."""
    with _lock:
        found = _factories.get((group, name))
        if found is None:
            found = _factories[(group, name)] = _load(group, name, hint)
        return found


def _load(group: str, name: str, hint: str) -> Callable[..., Any]:
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            loaded: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            moved = (
                " (Ratchet's own adapters go by name now: RATCHET_DISPATCHER=celery)"
                if module.split(".")[0] == "workers"
                else ""
            )
            raise ConfigurationError(
                f"{name!r} cannot be imported ({exc}); name an importable module:Class{moved}"
            ) from None
        return loaded
    points = entry_points(group=group, name=name)
    if not points:
        raise ConfigurationError(
            f"no adapter {name!r} is installed in the entry point group {group!r}: install Ratchet with its "
            "workers package (install this package; from a source checkout, `pip install -e .`, again after a "
            f"change of its entry points), {hint}"
        )
    point = next(iter(points))
    try:
        loaded = point.load()
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"the adapter {name!r} ({point.value}) cannot be imported: {exc}") from None
    return loaded
