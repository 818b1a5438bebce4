"""Watching everything that passes through a Redis broker, to search it for a secret.

A scan of the keys at the end of a test sees little: the queues are empty once the messages
were consumed, message bodies are base64, and task events go through pub/sub without leaving a
key. `BrokerWatch` records, from before the first message to the end, every command the server
runs (MONITOR: each message pushed onto a queue, each PUBLISH) and every pub/sub message
(PSUBSCRIBE '*': the events Flower reads); `holds` searches bytes for a secret, also inside
base64 (kombu's bodies) and JSON strings at any depth.
"""

from __future__ import annotations

import base64
import binascii
import re
import threading
from collections.abc import Iterator

import redis

# Long enough to skip words and ids, short enough for the base64 of a short JSON body.
_BASE64 = re.compile(rb"[A-Za-z0-9+/]{16,}={0,2}")


def holds(blob: bytes, secret: str, depth: int = 4) -> bool:
    """True if `secret` is in `blob`, as is or in a base64 token of it (nested `depth` deep)."""
    if secret.encode() in blob:
        return True
    if depth == 0:
        return False
    for token in _BASE64.findall(blob):
        try:
            decoded = base64.b64decode(token + b"=" * (-len(token) % 4), validate=True)
        except (binascii.Error, ValueError):
            continue
        if holds(decoded, secret, depth - 1):
            return True
    return False


def key_values(client: redis.Redis) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) for every value of every key: each string, list item, hash field and value,
    set member, sorted-set member and stream entry."""
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        values: list[bytes] = []
        if kind == "string":
            values = [client.get(key) or b""]
        elif kind == "list":
            values = list(client.lrange(key, 0, -1))
        elif kind == "hash":
            values = [v for pair in client.hgetall(key).items() for v in pair]
        elif kind == "set":
            values = list(client.smembers(key))
        elif kind == "zset":
            values = [member for member, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            values = [repr(entry).encode() for entry in client.xrange(key)]
        yield from ((key, v) for v in values)


class BrokerWatch:
    """Records every command (MONITOR) and every pub/sub message (PSUBSCRIBE '*') of a Redis
    server, in two threads, from `start` until `stop`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.commands: list[bytes] = []
        self.published: list[tuple[bytes, bytes]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._ready = threading.Barrier(3)

    def start(self) -> BrokerWatch:
        for target in (self._monitor, self._subscribe):
            thread = threading.Thread(target=target, name=f"broker-watch-{target.__name__}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._ready.wait(10)  # both listen before anything the test starts can publish
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def __enter__(self) -> BrokerWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def leaks(self, secret: str) -> dict[str, list[str]]:
        """Where the secret was seen: commands run and messages published, abridged."""
        return {
            "commands": [c[:300].decode(errors="replace") for c in self.commands if holds(c, secret)],
            "pub/sub": [
                f"{channel.decode(errors='replace')}: {data[:300].decode(errors='replace')}"
                for channel, data in self.published
                if holds(data, secret)
            ],
        }

    def _monitor(self) -> None:
        conn = redis.Connection(port=self.port)
        try:
            conn.send_command("MONITOR")
            conn.read_response()
            self._ready.wait(10)
            while not self._stop.is_set():
                # can_read first: a read that times out would drop the connection, and MONITOR with it.
                if conn.can_read(timeout=0.1):
                    line = conn.read_response()
                    self.commands.append(line if isinstance(line, bytes) else str(line).encode())
        finally:
            conn.disconnect()

    def _subscribe(self) -> None:
        with redis.Redis(port=self.port) as client, client.pubsub() as pubsub:
            pubsub.psubscribe("*")
            pubsub.get_message(timeout=5)  # the psubscribe confirmation
            self._ready.wait(10)
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=0.1)
                if message is not None and message["type"] == "pmessage":
                    self.published.append((message["channel"], message["data"]))
