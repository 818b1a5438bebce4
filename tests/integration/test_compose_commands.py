"""compose.yaml's services, run as the plain processes it would start (no Docker engine here):
migrate, the scripted model, a model worker, a tool worker, beat and Flower, on a Redis server of
the test's own and an empty PostgreSQL database. A run goes through from the CLI and from HTTP
(Flower's send-task), Flower shows the steps by name with their run ids, beat's sweep recovers a
run nothing else would, and the API key reaches none of Flower, Redis (its keys, the messages
that went through it, its pub/sub events), the database or the logs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import create_engine, text

from orchestrator import Client, RunNotFoundError, RunStatus
from orchestrator.messages import Message
from orchestrator.settings import Settings
from orchestrator.store import Store, forget_stores
from orchestrator.testing.waiting import wait_until
from tests.integration.broker_watch import BrokerWatch, holds, key_values
from tests.isolation import PgDatabases
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
CANARY = f"sk-canary-{uuid.uuid4().hex}"
FLOWER_AUTH = "ratchet:test-password"
pytestmark = [pytest.mark.slow]


def expand(word: str, env: dict[str, str]) -> str:
    """compose's ${VAR:-default} interpolation."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), word)


def flower_get(port: int, path: str) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic " + b64encode(FLOWER_AUTH.encode()).decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.read().decode()


def flower_post(port: int, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
    req.add_header("Authorization", "Basic " + b64encode(FLOWER_AUTH.encode()).decode())
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read().decode())


@pytest.fixture
def empty_pg_url(pg_databases: PgDatabases) -> Iterator[str]:
    """A database with no tables: compose's `migrate` service makes them."""
    url, drop = pg_databases.create(migrated=False)
    yield url
    forget_stores()
    drop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own: every command and pub/sub message on it is the stack's."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def stack(empty_pg_url: str, broker: RedisServer, tmp_path: Path) -> Iterator[dict[str, Any]]:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    model_port, flower_port = free_port(), free_port()
    env = {
        **os.environ,
        "RATCHET_DATABASE_URL": empty_pg_url,
        "RATCHET_BROKER_URL": broker.url,
        "RATCHET_AUTO_MIGRATE": "false",
        "RATCHET_APP": "tests.integration.compose_agents",
        # Beat sends the sweep this often (production: 15 s), so its recovery is quick to see.
        "RATCHET_SWEEP_SECONDS": "0.5",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
        "OPENAI_API_KEY": CANARY,
        "FLOWER_BASIC_AUTH": FLOWER_AUTH,
        "PYTHONPATH": str(ROOT),
    }
    bin_dir = Path(sys.executable).parent

    def command(service: str) -> list[str]:
        words = [expand(w, env) for w in compose[service]["command"]]
        words = [w.replace("redis://redis:6379/0", broker.url) for w in words]
        words = [{"--port=5555": f"--port={flower_port}", "8765": str(model_port)}.get(w, w) for w in words]
        words = ["127.0.0.1" if w == "0.0.0.0" else w for w in words]
        return [str(bin_dir / words[0]), *words[1:]]

    # Watching from before the first process starts: nothing it sends goes unseen.
    watch = BrokerWatch(broker.port).start()
    assert subprocess.run(command("migrate"), env=env, cwd=tmp_path, timeout=60).returncode == 0
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    try:
        for service in ("model", "worker-model", "worker-tools", "beat", "flower"):
            worker_env = dict(env)
            if service == "flower":  # compose gives the key to the workers only
                worker_env.pop("OPENAI_API_KEY")
            logs[service] = tmp_path / f"{service}.log"
            with logs[service].open("wb") as out:
                procs[service] = subprocess.Popen(
                    command(service), env=worker_env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
        wait_until(
            lambda: len(json.loads(flower_get(flower_port, "/api/workers?refresh=1"))) >= 2,
            90, what="flower to see both workers", interval=0.2, ignore=(OSError, ValueError),
        )  # fmt: skip
        yield {"env": env, "flower_port": flower_port, "logs": logs, "broker": broker, "watch": watch}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        watch.stop()


def test_compose_services_run_a_run_end_to_end_and_flower_shows_it_without_secrets(stack: dict[str, Any]) -> None:
    env, port = stack["env"], stack["flower_port"]
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("RATCHET_") and k != "RATCHET_APP"})

    # From the command line
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "ratchet"), "run", "compose-agent", "hello", "--wait", "--timeout", "60"],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stdout + cli.stderr
    run_id = cli.stdout.splitlines()[0].strip()
    assert f"run {run_id}  COMPLETED" in cli.stdout

    # Flower shows each step by task name, with the run id in its arguments
    tasks = wait_until(
        lambda: (t := json.loads(flower_get(port, "/api/tasks"))) and
        {v["name"] for v in t.values() if run_id in str(v.get("args"))} >= {"ratchet.model_call", "ratchet.tool_batch"}
        and t,
        60, what="flower to list the run's steps", interval=0.2, ignore=(OSError, ValueError),
    )  # fmt: skip
    assert any(k.startswith(run_id) for k in tasks)

    # From HTTP: Flower's send-task starts a run by task name with JSON arguments
    http_run = str(uuid.uuid4())
    body = {"args": ["compose-agent", "from http", None, http_run], "queue": "ratchet.control"}
    sent = flower_post(port, "/api/task/send-task/ratchet.start_run", body)
    assert sent.get("task-id")
    out = Client(settings).wait(
        wait_until(lambda: _exists(settings, http_run), 60, what="the HTTP run to exist", ignore=(RunNotFoundError,)),
        timeout=60,
    )
    assert out.status == RunStatus.COMPLETED and out.messages[1].content == "from http"

    # Beat schedules the sweep: a run whose step was never published (its producer died after
    # writing it) completes, and only a sweep publishes it (no worker runs one of its own here)
    orphan = _run_never_published(settings)
    assert Client(settings).wait(orphan, timeout=30).status == RunStatus.COMPLETED
    tools_log = stack["logs"]["worker-tools"].read_text(errors="replace")
    assert re.search(rf"ratchet\.sweep\[[^\]]+\] succeeded in [^:]+: .*'republished': \[[^\]]*'{orphan}'", tools_log)
    assert "Sending due task ratchet-sweep (ratchet.sweep)" in stack["logs"]["beat"].read_text(errors="replace")

    # The API key reached neither Flower, nor the broker, nor the database, nor any log
    assert CANARY not in flower_get(port, "/api/tasks")
    assert_not_in_broker(stack["watch"], stack["broker"], CANARY)
    engine = create_engine(env["RATCHET_DATABASE_URL"])
    with engine.connect() as conn:
        for table in ("ratchet_runs", "ratchet_messages", "ratchet_events", "ratchet_sessions"):
            dump = str(conn.execute(text(f"select * from {table}")).fetchall())
            assert CANARY not in dump, table
    engine.dispose()
    for name, log in stack["logs"].items():
        assert CANARY not in log.read_text(errors="replace"), name


def assert_not_in_broker(watch: BrokerWatch, broker: RedisServer, secret: str) -> None:
    """The secret was in no command the broker ran (messages queued, events published), no
    pub/sub message, and no value left in it."""
    watch.stop()
    with broker.client() as r:
        left = [f"{k.decode(errors='replace')}: {v[:300].decode(errors='replace')}" for k, v in key_values(r)
                if holds(v, secret)]  # fmt: skip
    leaks = {**watch.leaks(secret), "keys": left}
    assert not any(leaks.values()), f"the API key went through the broker: {leaks}"
    assert len(watch.commands) > 100 and watch.published, "the watch saw nothing: it cannot have seen a leak"


def _run_never_published(settings: Settings) -> str:
    """A QUEUED run due for publishing now, whose step no one published."""
    run_id = str(uuid.uuid4())
    Store.open(settings.database_url, auto_migrate=False).create_run(
        run_id=run_id, session_id=f"s-{run_id}", agent_name="compose-agent", kind="agent",
        input_messages=[Message(role="user", content="orphan")], publish_grace=0,
    )  # fmt: skip
    return run_id


def _exists(settings: Settings, run_id: str) -> str | None:
    Client(settings).get_run(run_id)
    return run_id
