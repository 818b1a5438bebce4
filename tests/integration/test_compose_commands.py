"""compose.yaml's services, run as the plain processes it would start (no Docker engine here):
migrate, the scripted model, a model worker, a tool worker, beat and Flower, on real Redis and
PostgreSQL. A run goes through from the CLI and from HTTP (Flower's send-task), Flower shows the
steps by name with their run ids, and the API key reaches none of Flower, Redis or the database."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from sqlalchemy import create_engine, text

from orchestrator import Client, RunNotFoundError, RunStatus
from orchestrator.settings import Settings
from orchestrator.testing.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
CANARY = f"sk-canary-{uuid.uuid4().hex}"
FLOWER_AUTH = "ratchet:test-password"
pytestmark = [pytest.mark.slow]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
def stack(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    broker = redis_url.rsplit("/", 1)[0] + "/12"
    redis.Redis.from_url(broker).flushdb()
    model_port, flower_port = free_port(), free_port()
    env = {
        **os.environ,
        "RATCHET_DATABASE_URL": pg_url,
        "RATCHET_BROKER_URL": broker,
        "RATCHET_AUTO_MIGRATE": "false",
        "RATCHET_APP": "tests.integration.compose_agents",
        "OPENAI_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
        "OPENAI_API_KEY": CANARY,
        "FLOWER_BASIC_AUTH": FLOWER_AUTH,
        "PYTHONPATH": str(ROOT),
    }
    bin_dir = Path(sys.executable).parent

    def command(service: str) -> list[str]:
        words = [expand(w, env) for w in compose[service]["command"]]
        words = [w.replace("redis://redis:6379/0", broker) for w in words]
        words = [{"--port=5555": f"--port={flower_port}", "8765": str(model_port)}.get(w, w) for w in words]
        words = ["127.0.0.1" if w == "0.0.0.0" else w for w in words]
        return [str(bin_dir / words[0]), *words[1:]]

    assert subprocess.run(command("migrate"), env=env, cwd=tmp_path, timeout=60).returncode == 0
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs: dict[str, Path] = {}
    for service in ("model", "worker-model", "worker-tools", "beat", "flower"):
        worker_env = dict(env)
        if service == "flower":  # compose gives the key to the workers only
            worker_env.pop("OPENAI_API_KEY")
        logs[service] = tmp_path / f"{service}.log"
        procs[service] = subprocess.Popen(
            command(service), env=worker_env, cwd=tmp_path, stdout=logs[service].open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(
            lambda: len(json.loads(flower_get(flower_port, "/api/workers?refresh=1"))) >= 2,
            90, what="flower to see both workers", interval=0.2, ignore=(OSError, ValueError),
        )  # fmt: skip
        yield {"env": env, "flower_port": flower_port, "logs": logs, "broker": broker, "pg_url": pg_url}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


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

    # The API key reached neither Flower, nor the broker, nor the database, nor any log
    assert CANARY not in flower_get(port, "/api/tasks")
    r = redis.Redis.from_url(stack["broker"])
    for key in r.scan_iter():
        assert CANARY.encode() not in (r.dump(key) or b""), key
    engine = create_engine(stack["pg_url"].replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as conn:
        for table in ("ratchet_runs", "ratchet_messages", "ratchet_events", "ratchet_sessions"):
            dump = str(conn.execute(text(f"select * from {table}")).fetchall())
            assert CANARY not in dump, table
    engine.dispose()
    for name, log in stack["logs"].items():
        assert CANARY not in log.read_text(errors="replace"), name


def _exists(settings: Settings, run_id: str) -> str | None:
    Client(settings).get_run(run_id)
    return run_id
