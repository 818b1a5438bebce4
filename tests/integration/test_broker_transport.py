"""`workers/celery/broker.py` fixes a flaw of kombu's Redis transport: it overrides
`conn_or_acquire`, a public method of kombu's channel, and keeps the client kombu's own gives it;
its priorities are kombu's `priority_steps` option, with nothing overridden. The embedded broker,
`workers/celery/filesystem.py`, is a transport of Ratchet's own on kombu's virtual transport
interface, which fixes two flaws of kombu's filesystem transport (shown here on kombu's own).
These tests fail loudly when a kombu upgrade moves what either relies on, or fixes the flaw the
Redis override is for."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from kombu import Connection
from kombu.exceptions import ChannelError
from kombu.transport import filesystem as kombu_fs
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.transport.virtual import exchange as virtual_exchange

from orchestrator.ports import StepRef
from tests.conftest import make_settings
from workers.celery import broker, filesystem
from workers.celery.app import celery_config
from workers.celery.dispatch import CeleryDispatcher

POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD
EMPTY = inspect.Parameter.empty


def shape(function: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    """A signature without its annotations: names, kinds and defaults."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def test_kombus_redis_channel_still_has_what_the_override_relies_on_and_the_flaw_it_fixes(redis_url: str) -> None:
    base = kombu_redis.Channel
    # The method overridden: a generator-based context manager taking an optional client.
    assert shape(base.conn_or_acquire) == [("self", POSITIONAL, EMPTY), ("client", POSITIONAL, None)]
    assert inspect.isgeneratorfunction(inspect.unwrap(base.conn_or_acquire))
    assert shape(broker.Channel.conn_or_acquire) == shape(base.conn_or_acquire)
    assert isinstance(inspect.getattr_static(base, "pool"), property)
    assert broker.Transport.Channel is broker.Channel
    assert issubclass(broker.Transport, kombu_redis.Transport)
    # kombu's builds a new client on every call (the flaw: once it reuses one, drop the override),
    # on the channel's pool, and leaves it usable when its block ends (the override keeps it).
    with Connection(redis_url, transport=kombu_redis.Transport) as conn:
        channel = conn.channel()
        with channel.conn_or_acquire() as first:
            pass
        with channel.conn_or_acquire() as second:
            pass
        assert first is not second and first.connection_pool is second.connection_pool is channel.pool
        assert first.ping()


def test_celery_publishes_every_step_through_one_client_on_a_real_redis_channel(redis_url: str, tmp_path: Path) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    dispatcher = CeleryDispatcher(settings)
    try:
        # When two steps are published the way the engine publishes them
        dispatcher.publish(StepRef(run_id="run-a", seq=0, kind="model"))
        with dispatcher.app.producer_or_acquire() as producer:
            channel = producer.channel
            first = channel._ratchet_client
        dispatcher.publish(StepRef(run_id="run-a", seq=1, kind="model"))

        # Then both went through the override, which kept the one client kombu built on the channel's pool
        assert isinstance(channel, broker.Channel)
        assert first is not None and first.connection_pool is channel.pool
        assert channel._ratchet_client is first
        assert dispatcher.queue_lengths()[settings.model_queue] == 2
    finally:
        dispatcher.app.close()


def test_kombus_own_redis_transport_serves_runs_highest_priority_first(redis_url: str, tmp_path: Path) -> None:
    # Given steps published by priority, lowest first (None is as 0), the way the engine publishes them
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    priorities = [None, 0, 3, 9, 5, None, 9, 1]
    dispatcher = CeleryDispatcher(settings)
    try:
        for seq, priority in enumerate(priorities):
            dispatcher.publish(StepRef(run_id="run-p", seq=seq, kind="model", priority=priority))
    finally:
        dispatcher.app.close()
    # When a consumer on kombu's own Redis transport (what a rediss:// broker is served by), with
    # Ratchet's transport options and nothing of Ratchet's overridden, takes them one by one
    options = celery_config(settings)["broker_transport_options"]
    taken: list[int | None] = []
    with Connection(redis_url, transport=kombu_redis.Transport, transport_options=options) as conn:
        channel = conn.channel()
        assert type(channel) is kombu_redis.Channel and channel.priority_steps == broker.PRIORITY_STEPS
        while (message := channel.basic_get(settings.model_queue, no_ack=True)) is not None:
            taken.append(priorities[json.loads(message.body)[0][1]])
    # Then the highest priority came first, and steps of one priority in the order they were published
    assert taken == [9, 9, 5, 3, 1, None, 0, None]


#: A broker of each scheme kombu serves with its Redis transport.
REDIS_BROKERS = (
    "redis://localhost:6379/0",
    "rediss://localhost:6380/0",
    "sentinel://localhost:26379;sentinel://localhost:26380",
    "redis+socket:///redis.sock",
)


@pytest.mark.parametrize("url", REDIS_BROKERS)
def test_every_redis_broker_gets_ten_priority_steps_and_steps_written_in_kombus_order(url: str) -> None:
    assert isinstance(Connection(url).transport, kombu_redis.Transport)  # kombu serves it with its Redis one
    options = celery_config(make_settings("sqlite:///x.db", url))["broker_transport_options"]
    assert options["priority_steps"] == list(range(10)), url
    assert [broker.message_priority(url, p) for p in (9, 5, 0, None)] == [0, 4, 9, 9]


def test_other_brokers_keep_the_runs_own_priorities() -> None:
    for url in ("amqp://guest@localhost//", "filesystem://localhost/"):
        assert [broker.message_priority(url, p) for p in (9, 0, None)] == [9, 0, None]
        assert "priority_steps" not in celery_config(make_settings("sqlite:///x.db", url))["broker_transport_options"]


# ---------------------------------------------------------------- the filesystem broker


def filesystem_channel(folder: Path, transport: type[Any]) -> Any:
    """A channel of `transport` on the embedded default's folders under `folder`."""
    for sub in ("queue", "control"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    options = {"data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
               "control_folder": str(folder / "control"), "store_processed": False}  # fmt: skip
    return Connection("filesystem://", transport=transport, transport_options=options).channel()


def test_the_filesystem_transport_implements_kombus_virtual_transport_hooks_and_is_the_embedded_default() -> None:
    # The hooks kombu's virtual channel calls (its documented interface for a transport, and for
    # fanout the three `FanoutExchange` asks for), with the signatures it calls them with.
    base, ours = virtual.Channel, filesystem.FilesystemChannel
    assert issubclass(ours, base) and not issubclass(ours, kombu_fs.Channel)
    for hook in ("_get", "_put", "_size", "_purge", "_delete", "get_table"):
        assert callable(getattr(base, hook)) and hook in vars(ours), hook
    put = [(n, POSITIONAL, EMPTY) for n in ("self", "queue", "message")]
    assert shape(base._put)[:3] == shape(ours._put)[:3] == put
    assert shape(base._get)[:2] == shape(ours._get)[:2]
    binds = inspect.getsource(base.queue_bind)
    assert "self._queue_bind(exchange, *meta)" in binds and "supports_fanout" in binds
    assert "_put_fanout" in inspect.getsource(virtual_exchange.FanoutExchange.deliver)
    assert "self._delete(queue, exchange, *meta" in inspect.getsource(base.queue_delete)
    assert ours.supports_fanout
    assert celery_config(make_settings("sqlite:///x.db", "filesystem://localhost/"))["broker_transport"] == (
        broker.FILESYSTEM_TRANSPORT
    )


def test_the_filesystem_transport_keeps_kombus_files_and_delivers_fanout_and_direct(tmp_path: Path) -> None:
    # A message in kombu's own format (what a producer on kombu's transport wrote) is read
    queue = tmp_path / "fs" / "queue"
    ours = filesystem_channel(tmp_path / "fs", filesystem.FilesystemTransport)
    kombus = filesystem_channel(tmp_path / "fs", kombu_fs.Transport)
    kombus._put("ratchet.model", {"body": "from kombu"})
    assert ours._size("ratchet.model") == 1
    assert ours._get("ratchet.model") == {"body": "from kombu"}
    # and kombu's reads ours
    ours._put("ratchet.model", {"body": "from ours"})
    assert kombus._get("ratchet.model") == {"body": "from ours"}
    # Through the channel's public API: a fanout exchange reaches every bound queue; a purge, a delete
    ours.exchange_declare("events", type="fanout")
    for name in ("a", "b"):
        ours.queue_declare(name)
        ours.queue_bind(name, "events", "")
    ours.basic_publish(ours.prepare_message("hello"), "events", "")
    assert ours._size("a") == ours._size("b") == 1
    assert [b.queue for b in ours.get_table("events")] == ["b", "a"]
    assert ours.queue_purge("a") == 1 and ours._size("a") == 0
    ours.queue_delete("b")
    assert [b.queue for b in ours.get_table("events")] == ["a"] and ours._size("b") == 0
    assert sorted(p.name for p in queue.iterdir()) == []
    for name in ("../escape", "..", "NUL.x", "com1"):
        with pytest.raises(ChannelError, match="Invalid exchange name"):
            ours.get_table(name)


def test_a_queue_binds_while_another_process_is_creating_the_exchange_table(tmp_path: Path) -> None:
    # Another process has created the table file and not yet written it: the moment kombu's own
    # channel reads it as JSON and fails, which stopped a worker started beside its producer.
    (tmp_path / "fs" / "control").mkdir(parents=True)
    (tmp_path / "fs" / "control" / "ratchet.model.exchange").write_bytes(b"")
    kombus = filesystem_channel(tmp_path / "fs", kombu_fs.Transport)
    with pytest.raises(ValueError):
        kombus._queue_bind("ratchet.model", "ratchet.model", "", "ratchet.model")

    ours = filesystem_channel(tmp_path / "fs", filesystem.FilesystemTransport)
    ours._queue_bind("ratchet.model", "ratchet.model", "", "ratchet.model")
    ours._queue_bind("ratchet.model", "other", "", "other")
    ours._queue_bind("ratchet.model", "other", "", "other")  # binding again changes nothing
    assert [q.queue for q in ours.get_table("ratchet.model")] == ["other", "ratchet.model"]


def test_a_message_being_written_is_not_read_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = tmp_path / "fs" / "queue"
    # kombu's channel creates a message's file, then writes it: a consumer that takes the file in
    # between (another process) reads it empty, and the worker stopped on the JSON error
    kombus = filesystem_channel(tmp_path / "fs", kombu_fs.Transport)
    (queue / "1_a.ratchet.model.msg").write_bytes(b"")
    with pytest.raises(ValueError):
        kombus._get("ratchet.model")

    # Ours writes it under a name no queue reads, then renames it: a message in the making is not
    # one yet, and the one it becomes is whole
    ours = filesystem_channel(tmp_path / "fs", filesystem.FilesystemTransport)
    (queue / ".part-0123").write_bytes(b'{"half')
    with pytest.raises(Empty):
        ours._get("ratchet.model")
    # What the queue held, and what the file held, at the moment it got its message's name
    renamed: list[tuple[list[str], bytes]] = []
    real_replace = os.replace

    def watched(src: str, dst: str) -> None:
        renamed.append((sorted(os.listdir(queue)), Path(src).read_bytes()))
        real_replace(src, dst)

    monkeypatch.setattr(filesystem.os, "replace", watched)
    ours._put("ratchet.model", {"body": "whole"})
    ((before, written),) = renamed
    assert not [name for name in before if name.endswith(".ratchet.model.msg")]  # not a message yet
    assert json.loads(written) == {"body": "whole"}  # already whole
    assert ours._get("ratchet.model") == {"body": "whole"}
    assert sorted(p.name for p in queue.iterdir()) == [".part-0123"]  # nothing of its own left behind


def test_a_put_that_fails_or_is_interrupted_before_its_rename_leaves_no_part_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = tmp_path / "fs" / "queue"
    ours = filesystem_channel(tmp_path / "fs", filesystem.FilesystemTransport)
    with pytest.raises(TypeError):  # a payload JSON cannot hold: refused before any file exists
        ours._put("ratchet.model", {"body": object()})

    def interrupted(src: str, dst: str) -> None:  # the step's soft time limit lands between write and rename
        raise SoftTimeLimitExceeded()

    monkeypatch.setattr(filesystem.os, "replace", interrupted)
    with pytest.raises(SoftTimeLimitExceeded):
        ours._put("ratchet.model", {"body": "whole"})
    assert list(queue.iterdir()) == []


def test_a_part_file_a_killed_writer_left_is_removed_by_a_consumer_and_never_delivered(tmp_path: Path) -> None:
    # Given the part files of a writer killed between its write and its rename (an hour ago), and
    # of one writing now, named as `_put` names them
    queue = tmp_path / "fs" / "queue"
    ours = filesystem_channel(tmp_path / "fs", filesystem.FilesystemTransport)
    left = queue / f"{filesystem.PART}{'a' * 32}"
    left.write_bytes(b'{"body": "half')
    hour_ago = time.time() - 3600
    os.utime(left, (hour_ago, hour_ago))
    writing = queue / f"{filesystem.PART}{'b' * 32}"
    writing.write_bytes(b'{"body": "wh')
    ours._put("ratchet.model", {"body": "whole"})

    # When a worker's channel polls the queue
    assert ours._get("ratchet.model") == {"body": "whole"}  # the message, and only it
    with pytest.raises(Empty):
        ours._get("ratchet.model")

    # Then the old part file is gone, the one being written is left to its writer
    assert sorted(p.name for p in queue.iterdir()) == [writing.name]
    # and a channel looks again only every PART_SWEEP_SECONDS, not at each poll
    left.write_bytes(b"{")
    os.utime(left, (hour_ago, hour_ago))
    with pytest.raises(Empty):
        ours._get("ratchet.model")
    assert left.exists()
    assert filesystem.remove_stale_parts(queue) == [left.name]


def test_processes_binding_one_exchange_at_once_keep_every_binding(tmp_path: Path) -> None:
    # Each process imports kombu and the transport only (not this module, which imports Celery)
    code = (
        "import sys\n"
        "from kombu import Connection\n"
        "from workers.celery import filesystem\n"
        "d = sys.argv[1]\n"
        "options = {'data_folder_in': d + '/queue', 'data_folder_out': d + '/queue',"
        " 'control_folder': d + '/control'}\n"
        "channel = Connection('filesystem://', transport=filesystem.FilesystemTransport,"
        " transport_options=options).channel()\n"
        "for i in range(20):\n"
        "    channel._queue_bind('shared', f'{sys.argv[2]}.{i}', '', f'{sys.argv[2]}.{i}')\n"
    )
    for sub in ("queue", "control"):
        (tmp_path / "fs" / sub).mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "fs"), f"p{n}"], cwd=root) for n in range(6)]
    assert [p.wait(120) for p in procs] == [0] * 6
    table = filesystem_channel(tmp_path / "fs", filesystem.FilesystemTransport).get_table("shared")
    assert sorted(q.queue for q in table) == sorted(f"p{n}.{i}" for n in range(6) for i in range(20))
