"""Servers a test runs for itself: a free port, a private redis-server (which the test may
restart, watch with MONITOR and PSUBSCRIBE, and which leaves nothing behind when killed), and the
session's scripted model server made fresh for one test (`fresh_server`)."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
import redis

from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private redis-server on a free port, without persistence (a restart loses everything),
    or `persistent`: every write in its append-only file before it answers, so a restart after
    a kill finds what it held."""

    def __init__(self, folder: Path, *, persistent: bool = False) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.persistence = ["--appendonly", "yes", "--appendfsync", "always"] if persistent else ["--appendonly", "no"]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **options: object) -> redis.Redis:
        return redis.Redis(port=self.port, socket_connect_timeout=1, **options)  # type: ignore[arg-type]

    def start(self) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *self.persistence,
             "--dir", str(self.folder), "--logfile", str(self.folder / "redis.log")],
        )  # fmt: skip
        wait_until(self._pong, timeout=10, what=f"redis-server on port {self.port}")
        return self

    def _pong(self) -> bool:
        try:
            with self.client() as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        """Kill the server: without persistence, queued and unacked messages are gone."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


def fresh_server(
    server: ScriptedServer,
    monkeypatch: pytest.MonkeyPatch,
    config: ScriptConfig,
    *,
    env: Mapping[str, str] | None = None,
    unset: Iterable[str] = (),
) -> ScriptedServer:
    """`server` (the session's, `scripted_server`) for one test: `config` its script, its request
    log and fault budgets cleared, held calls let go; and for this test only, the variables an
    adapter reads set (`env`) or removed (`unset`)."""
    for name in unset:
        monkeypatch.delenv(name, raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    server.configure(config)
    server.reset()
    return server
