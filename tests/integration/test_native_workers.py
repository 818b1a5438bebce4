"""The worker as Celery users start it: `celery -A workers.celery.app worker` with RATCHET_APP naming the
agents' module, and `ratchet worker` passing the flags it does not know to `celery worker`. Both
take Celery's own flags (here --autoscale and --max-tasks-per-child, which replaces each pool
process after one task) and complete real runs; a worker without its agents' module refuses to
start, saying what to set."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.events import EventReceiver

from orchestrator import Client, RunStatus
from orchestrator.settings import Settings
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import TEST_KEY, make_settings, settings_env
from workers.celery.app import create_app

ROOT = Path(__file__).resolve().parents[2]
AGENTS = "tests.integration.native_agents"
FLAGS = ["--autoscale=2,1", "--max-tasks-per-child=1", "--without-mingle", "--without-gossip"]
pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def native_settings(redis_url: str, tmp_path: Path) -> Settings:
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    Client(settings).store  # noqa: B018  (opened: migrated)
    return settings


def worker_env(settings: Settings, scripted: ScriptedServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env.update(settings_env(settings), PYTHONPATH=str(ROOT), OPENAI_BASE_URL=scripted.url, OPENAI_API_KEY=TEST_KEY)
    # Migrated by the test's client: a pool process replaced after each task need not check again.
    env["RATCHET_AUTO_MIGRATE"] = "false"
    env.update(extra)
    return env


def command(kind: str) -> list[str]:
    """The worker command a Celery user types, or Ratchet's, each with Celery's flags."""
    name = f"native-{uuid.uuid4().hex[:6]}@%h"
    if kind == "celery":
        return [sys.executable, "-m", "celery", "-A", "workers.celery.app", "worker", "-l", "INFO", "-n", name, *FLAGS]
    return [sys.executable, "-m", "workers.cli", "worker", "-n", name, *FLAGS]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The worker processes a test starts, stopped (warm shutdown) when it ends."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.parametrize("kind", ["celery", "ratchet"])
def test_a_native_worker_takes_celery_flags_and_its_replaced_pool_processes_complete_runs(
    kind: str, native_settings: Settings, scripted: ScriptedServer, tmp_path: Path,
    started: list[subprocess.Popen[bytes]],
) -> None:  # fmt: skip
    # Given a worker started with Celery's flags, its agents named only by RATCHET_APP
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        started.append(
            subprocess.Popen(
                command(kind), env=worker_env(native_settings, scripted, RATCHET_APP=AGENTS), cwd=tmp_path,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        )  # fmt: skip

    # When runs of model call, tool batch, model call go through it
    client = Client(native_settings)
    runs = [client.start("native-agent", input=f"run {i}").run_id for i in range(2)]
    outs = [client.wait(run_id, timeout=60) for run_id in runs]

    # Then each completed, its tool batch in a pool process of its own: each process ran one
    # task and was replaced (--max-tasks-per-child=1), and the replacements knew the agents
    text = log.read_text(errors="replace")
    assert [o.status for o in outs] == [RunStatus.COMPLETED] * 2, text[-3000:]
    pids = {int(m) for o in outs for t in o.tools for m in re.findall(r"pid (\d+)", t.result or "")}
    assert len(pids) == 2 and started[0].pid not in pids
    assert "{min=1, max=2}" in text  # --autoscale reached Celery
    assert "AgentNotFoundError" not in text


def test_a_celery_worker_without_its_agents_module_refuses_to_start_and_says_what_to_set(
    native_settings: Settings, scripted: ScriptedServer, tmp_path: Path
) -> None:
    done = subprocess.run(
        command("celery"), env=worker_env(native_settings, scripted), cwd=tmp_path, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip

    assert done.returncode == 2, done.stdout + done.stderr
    assert "ratchet: error: no agent modules to import: set RATCHET_APP" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_worker_whose_agents_module_does_not_import_refuses_to_start(
    native_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    # The worker program `celery -A workers.celery.app worker` runs, in this process: nothing starts
    app = create_app(native_settings.model_copy(update={"app": "tests.integration.no_such_module"}))
    with pytest.raises(SystemExit) as refused:
        app.Worker()
    assert refused.value.code == 2
    assert "ratchet: error: cannot import --app 'tests.integration.no_such_module'" in capsys.readouterr().err


@pytest.mark.parametrize("pool", ["gevent", "threads"])
def test_ratchet_worker_on_an_in_process_pool_completes_runs_and_sends_task_events_once_asked_in_batches(
    pool: str, native_settings: Settings, scripted: ScriptedServer, tmp_path: Path,
    started: list[subprocess.Popen[bytes]],
) -> None:  # fmt: skip
    """gevent: Celery has no event loop there; threads on Redis: its loop would send them after each step."""
    # Given what a monitor sees on the broker: every event, and whether it came in a batch
    app = create_app(native_settings)
    seen: list[tuple[bool, dict[str, Any]]] = []

    class Recorder(EventReceiver):  # type: ignore[misc]
        def _receive(self, body: Any, message: Any, **kw: Any) -> None:
            seen.extend((isinstance(body, list), e) for e in (body if isinstance(body, list) else [body]))

    def task_events(run_id: str) -> dict[str, list[tuple[bool, str]]]:
        """The task events of the run's steps, by task id, as (batched, type) in arrival order."""
        ours = {e["uuid"] for _, e in seen if e["type"] == "task-received" and run_id in e.get("args", "")}
        got: dict[str, list[tuple[bool, str]]] = {u: [] for u in ours}
        for batched, e in seen:
            if e.get("uuid") in got:
                got[e["uuid"]].append((batched, e["type"]))
        return got

    with app.connection_for_read() as conn:
        recorder = Recorder(conn, handlers={}, app=app)
        threading.Thread(target=recorder.capture, kwargs={"limit": None, "wakeup": False}, daemon=True).start()
        # And `ratchet worker -P gevent` (which patches the standard library before importing it)
        # or `-P threads`, started with RATCHET_TASK_EVENTS=false
        name = f"{pool}-{uuid.uuid4().hex[:6]}"
        node = f"{name}@{socket.gethostname()}"
        with (tmp_path / "worker.log").open("wb") as out:
            # gevent's flag written as one word, as argparse takes it: the patch must find it too
            flag = ["-Pgevent"] if pool == "gevent" else ["-P", pool]
            argv = [str(Path(sys.executable).parent / "ratchet"), "worker", *flag, "-c", "20", "-n", node]
            started.append(
                subprocess.Popen(
                    argv, env=worker_env(native_settings, scripted, RATCHET_APP=AGENTS, RATCHET_TASK_EVENTS="false"),
                    cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )
            )  # fmt: skip
        try:
            wait_until(lambda: any(e.get("hostname") == node for _, e in seen), 60, what="the worker's heartbeat")
            client = Client(native_settings)

            # When a run of model call, tool batch, model call goes through it, then another after
            # a monitor asked the worker for task events, as Flower does every few seconds
            quiet = client.start("native-agent", input="before").run_id
            assert client.wait(quiet, timeout=60).status == RunStatus.COMPLETED
            wait_until(
                lambda: app.control.broadcast("enable_events", destination=[node], reply=True, timeout=2),
                30, what="the worker to answer enable_events",
            )  # fmt: skip
            watched = client.start("native-agent", input="after").run_id
            out = client.wait(watched, timeout=60)
            assert out.status == RunStatus.COMPLETED, (tmp_path / "worker.log").read_text(errors="replace")[-3000:]

            # Then the monitor got each of the second run's three steps received, started and
            # succeeded, in that order, all in batches sent apart from the steps (not a publish per
            # event on their way); and nothing of the first run's, sent before (events come in order)
            def all_three() -> dict[str, list[tuple[bool, str]]]:
                got = task_events(watched)
                return got if len(got) == 3 and all(len(v) == 3 for v in got.values()) else {}

            events = wait_until(all_three, 20, what="the second run's task events")
            for kinds in events.values():
                assert kinds == [(True, "task-received"), (True, "task-started"), (True, "task-succeeded")]
            assert task_events(quiet) == {}
        finally:
            recorder.should_stop = True
