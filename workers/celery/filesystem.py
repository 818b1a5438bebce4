"""The embedded default's broker: a filesystem transport of Ratchet's own, on kombu's virtual
transport interface.

kombu's filesystem channel has two flaws that stop a worker: it binds a queue by creating its
exchange's table file empty and only then locking it to write the table, so a second process
binding at that moment (a producer and a worker started together, as the quick start does) reads
the empty file and fails on it; and it creates a message's file, then writes it, so a consumer in
another process can take the file empty in between and stop on the JSON error.

This channel is written against the interface kombu documents for virtual transports, not against
kombu's filesystem channel: `kombu.transport.virtual.Channel` with the hooks a transport
implements (`_get`, `_put`, `_size`, `_purge`, `_delete`, and for fanout `supports_fanout`,
`_queue_bind`, `get_table`, `_put_fanout`, as `kombu.transport.virtual.exchange.FanoutExchange`
asks), and `kombu.transport.virtual.Transport`. It keeps kombu's on-disk format (a message is
`<time>_<uuid>.<queue>.msg` in the queue folder; an exchange's table is `<exchange>.exchange`, a
JSON list of [routing_key, pattern, queue], in the control folder) and its transport options
(`data_folder_in`, `data_folder_out`, `control_folder`, `store_processed`, `processed_folder`).

- A table is created, read and rewritten under one lock, and an empty file reads as an empty table.
- A message is written whole under a `.part-*` name no queue reads, then renamed into its queue
  (atomic on one filesystem); the part is removed if the write or rename fails or is interrupted,
  and one a killed writer left behind is removed by a consuming channel, which looks every
  PART_SWEEP_SECONDS (first at its first poll) for those older than PART_STALE_SECONDS.
- An exchange's name must be `[A-Za-z0-9._-]+`, not all dots and not a Windows device's name: it
  becomes a file name.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from functools import cached_property
from pathlib import Path
from queue import Empty
from typing import Any, NamedTuple, cast

from kombu.exceptions import ChannelError
from kombu.transport import filesystem as kombu_fs
from kombu.transport import virtual
from kombu.utils import json as kombu_json

#: kombu's file locks (fcntl's flock on POSIX, its own on Windows), public functions of its
#: filesystem module, typed.
_lock = cast(Callable[[Any, int], None], kombu_fs.lock)
_unlock = cast(Callable[[Any], None], kombu_fs.unlock)
#: What a message's file is called until it is whole (`FilesystemChannel._put`).
PART = ".part-"
#: A part file this old is one whose writer died between its write and its rename: a write
#: takes milliseconds. (A writer frozen longer finds its part gone, and its publish fails.)
PART_STALE_SECONDS = 60.0
#: How often a consuming channel looks for them.
PART_SWEEP_SECONDS = 60.0
#: What an exchange's name may hold: it is a file's name in the control folder.
_EXCHANGE = re.compile(r"\A[A-Za-z0-9._-]+\Z")
#: Names Windows gives a device, not a file, whatever follows their first dot (as kombu refuses them).
_DEVICES = frozenset(["CON", "PRN", "AUX", "NUL", *(f"COM{d}" for d in "123456789"), *(f"LPT{d}" for d in "123456789")])
log = logging.getLogger("ratchet.worker")


class Binding(NamedTuple):
    """One row of an exchange's table (kombu's `exchange_queue_t`, by position)."""

    routing_key: str
    pattern: str
    queue: str


class FilesystemChannel(virtual.Channel):
    """A filesystem channel whose exchange tables two processes can bind at once, and whose
    messages no consumer can read half-written."""

    supports_fanout = True
    _parts_swept = -math.inf  # when this channel last looked for part files left behind

    # ------------------------------------------------------------ the exchange tables

    def _exchange_path(self, exchange: str) -> Path:
        device = exchange.partition(".")[0].upper() in _DEVICES
        if exchange != "" and (not _EXCHANGE.match(exchange) or not exchange.strip(".") or device):
            raise ChannelError(f"Invalid exchange name: {exchange!r}: use A-Z, a-z, 0-9, '.', '_' and '-'")
        return self.control_folder / f"{exchange}.exchange"

    def get_table(self, exchange: str) -> list[Binding]:
        file = self._exchange_path(exchange)
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
        self._rewrite(
            exchange, lambda table, entry: table if entry in table else [entry, *table], routing_key, pattern, queue
        )

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)
        if len(args) >= 3:  # (exchange, routing_key, pattern), as `queue_delete` passes them
            exchange, routing_key, pattern = args[:3]
            self._rewrite(exchange, lambda table, entry: [b for b in table if b != entry], routing_key, pattern, queue)

    def _rewrite(
        self,
        exchange: str,
        change: Callable[[list[Binding], Binding], list[Binding]],
        routing_key: str,
        pattern: str,
        queue: str,
    ) -> None:
        """Read the exchange's table, change it and write it back, all under one lock (the file
        created if it is missing, never truncated before it is read)."""
        file = self._exchange_path(exchange)
        self.control_folder.mkdir(exist_ok=True)
        entry = Binding(routing_key or "", pattern or "", queue or "")
        try:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ChannelError(f"Cannot open {file}") from exc
        with os.fdopen(fd, "rb+", buffering=0) as f:
            _lock(f, kombu_fs.LOCK_EX)
            try:
                table = _table(f.read())
                changed = change(table, entry)
                if changed != table:
                    f.seek(0)
                    f.truncate()
                    f.write(json.dumps([list(b) for b in changed]).encode())
            finally:
                _unlock(f)

    def _put_fanout(self, exchange: str, payload: Any, routing_key: str, **kwargs: Any) -> None:
        for binding in self.get_table(exchange):
            self._put(binding.queue, payload, **kwargs)

    # ------------------------------------------------------------ messages

    def _put(self, queue: str, message: Any, **kwargs: Any) -> None:
        """Write the message whole under a name no queue reads, then rename it into its queue."""
        folder = self.data_folder_out
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"  # kombu's format and order
        body = kombu_json.dumps(message).encode()  # type: ignore[no-untyped-call]  # before any file exists
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

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        """The oldest message of `queue`, taken (moved out of the folder first, so that one
        consumer of many gets it); Empty if there is none."""
        now = time.monotonic()
        if now - self._parts_swept >= PART_SWEEP_SECONDS:
            self._parts_swept = now
            remove_stale_parts(Path(self.data_folder_in))
        processed = self.processed_folder if self.store_processed else tempfile.gettempdir()
        for filename in self._messages(queue):
            try:
                shutil.move(os.path.join(self.data_folder_in, filename), processed)
            except OSError:  # taken by another consumer meanwhile
                continue
            taken = os.path.join(processed, filename)
            try:
                with open(taken, "rb") as f:
                    payload = f.read()
                if not self.store_processed:
                    os.remove(taken)
            except OSError as exc:
                raise ChannelError(f"Cannot read file {filename!r} from queue.") from exc
            return kombu_json.loads(payload)  # type: ignore[no-untyped-call]
        raise Empty()

    def _messages(self, queue: str) -> list[str]:
        """The files of `queue`'s messages in the queue folder, oldest first."""
        suffix = f"{queue}.msg"
        return sorted(name for name in os.listdir(self.data_folder_in) if name.partition(".")[2] == suffix)

    def _size(self, queue: str) -> int:
        return len(self._messages(queue))

    def _purge(self, queue: str) -> int:
        count = 0
        for filename in self._messages(queue):
            with suppress(OSError):  # taken by a consumer meanwhile
                os.remove(os.path.join(self.data_folder_in, filename))
                count += 1
        return count

    # ------------------------------------------------------------ options (kombu's names)

    @property
    def transport_options(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.connection.client.transport_options)

    @cached_property
    def data_folder_in(self) -> str:
        return str(self.transport_options.get("data_folder_in", "data_in"))

    @cached_property
    def data_folder_out(self) -> str:
        return str(self.transport_options.get("data_folder_out", "data_out"))

    @cached_property
    def store_processed(self) -> bool:
        return bool(self.transport_options.get("store_processed", False))

    @cached_property
    def processed_folder(self) -> str:
        return str(self.transport_options.get("processed_folder", "processed"))

    @property
    def control_folder(self) -> Path:
        return Path(self.transport_options.get("control_folder", "control"))


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


def _table(raw: bytes) -> list[Binding]:
    """An exchange's table from its file's bytes; an empty file (being created) is an empty table."""
    text = raw.decode()
    return [Binding(*row) for row in json.loads(text)] if text.strip() else []


class FilesystemTransport(virtual.Transport):
    """The filesystem transport with `FilesystemChannel`; its state (the exchanges declared) is
    one per process, as kombu's."""

    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic", "fanout"])
    )
    Channel = FilesystemChannel
    global_state = virtual.BrokerState()  # type: ignore[no-untyped-call]
    default_port = 0  # type: ignore[assignment]  # kombu declares None
    driver_type = "filesystem"
    driver_name = "filesystem"

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)  # type: ignore[no-untyped-call]
        self.state = self.global_state

    def driver_version(self) -> str:
        return "N/A"
