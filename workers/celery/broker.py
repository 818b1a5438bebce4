"""kombu's transports, with two of their flaws fixed: the Redis one builds a client object per
message; the filesystem one (the embedded default's broker) can crash a worker that starts beside
another process. And a run's priority as kombu's Redis transport orders it.

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

Filesystem. kombu's channel binds a queue by creating its exchange's table file empty and only
then locking it to write the table: a second process binding at that moment (a producer and a
worker started together, as the quick start does) reads the empty file and fails on it, which
stops the worker. `FilesystemChannel` creates, reads and rewrites the table under one lock and
reads an empty file as an empty table. And it writes a message whole before the message has its
name (kombu's creates the named file, then writes it, and a consumer in another process can take
it empty in between): under a `.part-*` name no queue reads, removed if the write or rename fails
or is interrupted; one a killed writer left behind is removed by a consuming channel, which looks
every PART_SWEEP_SECONDS (first at its first poll) for those older than PART_STALE_SECONDS.
`_queue_bind`, `_put` and `_get` (hooks of kombu's virtual channel) and `_exchange_file` (kombu
5.7's, which checks an exchange's name) are private to kombu: pyproject.toml bounds kombu to the
series tests/integration/test_broker_transport.py passed on.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, cast

from kombu.exceptions import ChannelError
from kombu.transport import filesystem as kombu_fs
from kombu.transport import redis as kombu_redis
from kombu.utils import json as kombu_json

from orchestrator.validation import PRIORITY_MAX

TRANSPORT = "workers.celery.broker:Transport"
FILESYSTEM_TRANSPORT = "workers.celery.broker:FilesystemTransport"
#: kombu's file locks (fcntl's flock on POSIX, its own on Windows), typed.
_lock = cast(Callable[[Any, int], None], kombu_fs.lock)
_unlock = cast(Callable[[Any], None], kombu_fs.unlock)
#: What a message's file is called until it is whole (`FilesystemChannel._put`).
PART = ".part-"
#: A part file this old is one whose writer died between its write and its rename: a write
#: takes milliseconds. (A writer frozen longer finds its part gone, and its publish fails.)
PART_STALE_SECONDS = 60.0
#: How often a consuming channel looks for them.
PART_SWEEP_SECONDS = 60.0
log = logging.getLogger("ratchet.worker")
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


class FilesystemChannel(kombu_fs.Channel):
    """A filesystem channel whose exchange tables two processes can bind at once, and whose
    messages no consumer can read half-written."""

    _parts_swept = -math.inf  # when this channel last looked for part files left behind

    def get_table(self, exchange: str) -> list[Any]:
        file: Path = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        try:
            with file.open("rb") as f:
                _lock(f, kombu_fs.LOCK_SH)
                try:
                    return _table(f.read())
                finally:
                    _unlock(f)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        file: Path = self._exchange_file(exchange)  # type: ignore[no-untyped-call]
        self.control_folder.mkdir(exist_ok=True)
        entry = kombu_fs.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        try:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)  # never truncated: read under the lock
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc
        with os.fdopen(fd, "rb+", buffering=0) as f:
            _lock(f, kombu_fs.LOCK_EX)
            try:
                table = _table(f.read())
                if entry not in table:
                    table.insert(0, entry)
                    f.seek(0)
                    f.truncate()
                    f.write(json.dumps(table).encode())
            finally:
                _unlock(f)

    # kombu names the message `payload` here and `message` in the base class it overrides
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Write the message whole under a name no queue reads, then rename it into its queue.
        kombu's creates the message's file, then writes it: a consumer in another process that
        takes the file in between reads it empty and its worker stops on the JSON error."""
        folder = self.data_folder_out
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"  # kombu's, so its order
        body = kombu_json.dumps(payload).encode()  # type: ignore[no-untyped-call]  # before any file exists
        part = os.path.join(folder, f"{PART}{uuid.uuid4().hex}")  # `_get` reads only "<x>.<queue>.msg"
        try:
            with open(part, "wb") as f:
                f.write(body)
            os.replace(part, os.path.join(folder, name))  # atomic: the message appears whole
        except BaseException as exc:  # a disk error, or a signal (a soft time limit) in between
            with suppress(OSError):
                os.unlink(part)
            if isinstance(exc, OSError):
                raise ChannelError(f"Cannot add file {name!r} to directory") from exc
            raise

    def _get(self, queue: str, timeout: float | None = None) -> Any:  # the base class's signature
        now = time.monotonic()
        if now - self._parts_swept >= PART_SWEEP_SECONDS:
            self._parts_swept = now
            remove_stale_parts(Path(self.data_folder_in))
        return super()._get(queue)  # type: ignore[no-untyped-call]


def remove_stale_parts(folder: Path, *, older_than: float = PART_STALE_SECONDS) -> list[str]:
    """Remove the part files in `folder` older than `older_than` seconds (never a message: a
    message has its queue's name); the names removed."""
    removed: list[str] = []
    cutoff = time.time() - older_than
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PART):
            continue
        with suppress(FileNotFoundError):  # renamed by its writer, or removed by another consumer
            if entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)
                removed.append(entry.name)
    if removed:
        log.warning("broker: removed %d message file(s) a writer left unfinished in %s", len(removed), folder)
    return removed


def _table(raw: bytes) -> list[Any]:
    """An exchange's table from its file's bytes; an empty file (being created) is an empty table."""
    text = raw.decode()
    return [kombu_fs.exchange_queue_t(*q) for q in json.loads(text)] if text.strip() else []


class FilesystemTransport(kombu_fs.Transport):
    """kombu's filesystem transport with `FilesystemChannel` above."""

    Channel = FilesystemChannel
