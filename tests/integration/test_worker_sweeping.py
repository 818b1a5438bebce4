"""A worker sweeps in its main process, once per worker however many pool processes it has; and
beat's sweep task, which a deployment that runs `ratchet beat` sends every RATCHET_SWEEP_SECONDS,
takes the same lease and sends no task events (17,280 a day would push the steps out of what
Flower keeps). Real `ratchet worker` processes, a real event receiver on the broker."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.events import EventReceiver

from orchestrator import Client
from orchestrator.settings import Settings
from orchestrator.sweeping import SWEEP_LEASE
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings, settings_env
from workers.celery.app import CONTINUE_TASK, SWEEP_TASK, create_app

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def settings(redis_url: str, tmp_path: Path) -> Settings:
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url, sweep_seconds=0.5)
    Client(settings).store  # noqa: B018  (opened: migrated)
    return settings


@pytest.fixture
def start_worker(settings: Settings, tmp_path: Path) -> Iterator[Any]:
    """Start `ratchet worker -c N` as a plain process (stopped, warm, at the end); its node name."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(concurrency: int, **env: str) -> tuple[str, subprocess.Popen[bytes], Path]:
        node = f"sweeping-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        log = tmp_path / f"{node.split('@')[0]}.log"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
        environ.update(settings_env(settings), PYTHONPATH=str(ROOT), RATCHET_AUTO_MIGRATE="false", **env)
        argv = [sys.executable, "-m", "workers.cli", "worker", "--app", "tests.integration.native_agents"]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*argv, "-c", str(concurrency), "-n", node, "-l", "INFO"],
                env=environ,
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(proc)
        return node, proc, log

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_a_prefork_worker_sweeps_in_its_main_process_only_and_lets_the_lease_go_when_it_stops(
    settings: Settings, start_worker: Any
) -> None:
    # Given a worker with three pool processes, started as a newcomer starts one (it sweeps)
    store = Client(settings).store
    node, proc, log = start_worker(3)

    # When it has swept for a while
    lease = wait_until(lambda: store.lease(SWEEP_LEASE), timeout=60, what="the worker to take the sweep lease")
    wait_until(lambda: (now := store.lease(SWEEP_LEASE)) and now.renewed_at > lease.renewed_at + 1, timeout=30)

    # Then one sweeper swept: the worker's main process's, not a pool process's
    assert lease.owner.startswith(f"{node}:{proc.pid}:"), lease
    assert log.read_text(errors="replace").count("took the sweep lease, and sweeps") == 1

    # And once the worker stops (warm shutdown), the lease is free for another at once
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(60) == 0
    final = store.lease(SWEEP_LEASE)
    assert final is not None and final.owner == lease.owner and not final.held(time.time())


def test_beats_sweep_task_takes_the_sweep_lease_and_sends_no_task_events(settings: Settings, start_worker: Any) -> None:
    # Given what a monitor sees on the broker, and a worker that sends task events (the default)
    # but does not sweep by itself, as where `ratchet beat` sends the sweep
    app = create_app(settings)
    seen: list[dict[str, Any]] = []
    listening = threading.Event()

    class Recorder(EventReceiver):  # type: ignore[misc]
        def on_consume_ready(self, *args: Any, **kwargs: Any) -> None:
            listening.set()

        def _receive(self, body: Any, message: Any, **kw: Any) -> None:
            seen.extend(body if isinstance(body, list) else [body])

    store = Client(settings).store
    with app.connection_for_read() as conn:
        recorder = Recorder(conn, handlers={}, app=app)
        threading.Thread(target=recorder.capture, kwargs={"limit": None, "wakeup": False}, daemon=True).start()
        try:
            assert listening.wait(30)
            node, _, log = start_worker(1, RATCHET_WORKER_SWEEPS="false")
            wait_until(lambda: any(e.get("hostname") == node for e in seen), 60, what="the worker's heartbeat")

            # When beat's sweep task runs on it, then another task (a continue of no run: it fails)
            sweep = app.send_task(SWEEP_TASK).id
            wait_until(
                lambda: (lease := store.lease(SWEEP_LEASE)) is not None and lease.owner.startswith("beat:"),
                timeout=60,
                what="the sweep task to take the sweep lease",
            )
            other = app.send_task(CONTINUE_TASK, args=["no-such-run"]).id
            wait_until(
                lambda: any(e.get("uuid") == other and e["type"] == "task-failed" for e in seen),
                timeout=60,
                what="the other task's events",
            )

            # Then the other task's events came, and none of the sweep's, sent before it
            kinds = [e["type"] for e in seen if e.get("uuid") == other]
            assert kinds == ["task-received", "task-started", "task-failed"]
            assert [e for e in seen if e.get("uuid") == sweep] == []
            # And the sweep task let the lease go at the end of its pass
            lease = store.lease(SWEEP_LEASE)
            assert lease is not None and not lease.held(time.time())
            assert f"ratchet.sweep[{sweep}] succeeded" in log.read_text(errors="replace")
        finally:
            recorder.should_stop = True
            app.close()
