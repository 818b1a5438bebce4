"""What keeps tests apart on the shared servers: a PostgreSQL database per test, copied from a
template migrated once, and the cleanup of the Redis keys of a test's queues and of its
RabbitMQ queues.

Redis holds, for a queue `t.<tag>.model`: the queue's list (and its priority lists, the name
followed by "\\x06\\x16" and a digit), kombu's binding tables `_kombu.binding.t.<tag>.model` and
`_kombu.binding_permanent.t.<tag>.model`, and, while a message is delivered but not acked, an
entry in the `unacked` hash and the `unacked_index` sorted set that every queue shares.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable

import redis
from kombu import Connection
from sqlalchemy import Engine, create_engine, text

from orchestrator.store.database import migrate, open_engine

UNACKED, UNACKED_INDEX = "unacked", "unacked_index"


class PgDatabases:
    """Creates databases on the server of `admin_url` and drops them.

    `CREATE DATABASE ... TEMPLATE` copies a migrated template in about a tenth of a second,
    where migrating each new database would take several times that.

    Their commits do not wait for the WAL to reach the disk (`synchronous_commit` off, the
    database's default): on this machine's disk a flush took 7 ms a commit against under 1 ms,
    and a worker-backed test commits hundreds of times. What a commit makes visible, and when,
    is the same; only a crash of the server itself could lose the last ones, and no test crashes
    it. tests/integration/test_store.py, which checks the store's own setting of it, resets it."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._admin: Engine | None = None
        self._template: str | None = None

    @property
    def admin(self) -> Engine:
        if self._admin is None:
            self._admin = create_engine(self.admin_url, isolation_level="AUTOCOMMIT")
        return self._admin

    def url(self, name: str) -> str:
        return self.admin_url.rsplit("/", 1)[0] + "/" + name

    def template(self) -> str:
        """The migrated template (made on first use). No connection may stay open to it, or
        PostgreSQL refuses to copy it."""
        if self._template is None:
            name = self._create("ratchet_tmpl")
            engine = open_engine(self.url(name))
            try:
                migrate(engine)
            finally:
                engine.dispose()
            self._template = name
        return self._template

    def create(self, *, migrated: bool = True) -> tuple[str, Callable[[], None]]:
        """A new database (migrated unless asked otherwise): its URL, and a function that drops it."""
        name = self._create("ratchet_test", template=self.template() if migrated else None)
        return self.url(name), lambda: self._drop(name)

    def close(self) -> None:
        if self._template is not None:
            self._drop(self._template)
            self._template = None
        if self._admin is not None:
            self._admin.dispose()
            self._admin = None

    def _create(self, prefix: str, template: str | None = None) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
            conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit TO off'))
        return name

    def _drop(self, name: str) -> None:
        # FORCE: a connection a test leaked (a worker thread, a pool) must not keep it alive.
        with self.admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class BrokerLeftovers:
    """Finds and deletes the Redis keys of queues named `t.<tag>.*`."""

    def __init__(self, url: str) -> None:
        self.url = url

    def find(self, tags: Iterable[str]) -> list[str]:
        """The keys, and the unacked entries (as "unacked:<routing key>"), of these tags' queues."""
        marks = _marks(tags)
        with redis.Redis.from_url(self.url) as client:
            keys = [k.decode() for k in client.scan_iter(match="*t.*", count=1000) if _ours(k.decode(), marks)]
            unacked = [f"{UNACKED}:{key}" for _, key in self._unacked(client, marks)]
        return sorted(keys) + unacked

    def delete(self, tags: Iterable[str], *, keep_bindings: bool = False) -> None:
        """Delete these tags' queues and their unacked entries; `keep_bindings`: not kombu's
        binding keys (`_kombu.*`), which a process still running publishes through."""
        marks = _marks(tags)
        with redis.Redis.from_url(self.url) as client:
            keys = [
                k
                for k in client.scan_iter(match="*t.*", count=1000)
                if _ours(k.decode(), marks) and not (keep_bindings and k.startswith(b"_kombu."))
            ]
            if keys:
                client.delete(*keys)
            for tag, _ in self._unacked(client, marks):
                client.hdel(UNACKED, tag)
                client.zrem(UNACKED_INDEX, tag)

    @staticmethod
    def _unacked(client: redis.Redis, marks: tuple[str, ...]) -> list[tuple[bytes, str]]:
        """(delivery tag, routing key) of the unacked messages of these queues."""
        found = []
        for tag, entry in client.hscan_iter(UNACKED):
            try:
                routing_key = str(json.loads(entry)[2])
            except (ValueError, IndexError, TypeError):
                continue
            if _ours(routing_key, marks):
                found.append((tag, routing_key))
        return found


class AmqpQueues:
    """Deletes a test's RabbitMQ queues and the exchanges Celery declared for them (one direct
    exchange per queue, of the same name)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def delete(self, names: Iterable[str]) -> None:
        with Connection(self.url, connect_timeout=5) as conn:
            channel = conn.channel()
            for name in names:
                channel.queue_delete(name)
                channel.exchange_delete(name)


def _marks(tags: Iterable[str]) -> tuple[str, ...]:
    return tuple(f"t.{tag}." for tag in tags)


def _ours(key: str, marks: tuple[str, ...]) -> bool:
    return any(mark in key for mark in marks)
