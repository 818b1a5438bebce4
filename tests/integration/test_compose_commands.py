"""compose.yaml's services run as the plain processes compose would start (no Docker engine here).

The stack: the sample project's rendering by compose itself (tests/integration/sample_project:
Ratchet's compose.yaml included, its own agents; tests/integration/compose_render.py), with
`--env-file compose.scripted.env`: each service's command, environment, secrets and working
directory as compose gives them, the hosts of compose's network replaced by a Redis of the
test's own, an empty PostgreSQL database and free ports. Every service's health check passes; a
run goes through from the CLI, from the API (whose token comes from its secret's file; /metrics
answers with it) and from HTTP (Flower's send-task); Flower shows the steps by name with their
run ids; the workers' sweeper (no beat: every worker sweeps, one at a time) recovers a run
nothing else would; and none of the secrets (the API key, the API's token, Flower's password)
reaches Flower, Redis (its keys, the messages that went through it, its pub/sub events), the
database or the logs. tests/integration/test_compose_file.py checks the file's promises."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text

from orchestrator import Client, RunNotFoundError, RunStatus
from orchestrator.messages import Message
from orchestrator.settings import Settings
from orchestrator.store import Store, forget_stores
from orchestrator.testing.waiting import wait_until
from tests.integration.broker_watch import BrokerWatch, holds, key_values
from tests.integration.compose_render import ROOT, SCRIPTED_ENV, env_file, render, unescaped
from tests.isolation import PgDatabases
from tests.servers import RedisServer, free_port

#: A project of one's own on Ratchet's stack (tests/integration/test_compose_project.py).
SAMPLE = ROOT / "tests" / "integration" / "sample_project"
AGENT = "project-agent"
CANARY = f"sk-canary-{uuid.uuid4().hex}"
API_TOKEN = f"tok-canary-{uuid.uuid4().hex}"
FLOWER_PASSWORD = f"pw-canary-{uuid.uuid4().hex}"
FLOWER_AUTH = f"ratchet:{FLOWER_PASSWORD}"
WORKERS = ("worker-model", "worker-tools", "worker-control")


class MissingVariable(Exception):
    """compose's `${VAR:?message}` with VAR unset or empty: compose refuses to start."""


def expand(word: str, env: dict[str, str]) -> str:
    """compose's interpolation of one word (`${VAR}`, `${VAR:-default}`, `${VAR:?message}`, `$$`),
    for a test that runs one service's command without rendering the file."""

    def value(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        found = env.get(m["name"]) or ""
        if m["op"] == ":?" and not found:
            raise MissingVariable(f"required variable {m['name']} is missing a value: {m['arg']}")
        return found or (m["arg"] if m["op"] == ":-" else "")

    return re.sub(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:[-?])(?P<arg>[^}]*))?\}", value, word)


def ours(spec: dict[str, Any]) -> bool:
    """A service that runs Ratchet's image, or a project's built on it (not Redis or PostgreSQL)."""
    return not str(spec["image"]).startswith(("redis:", "postgres:"))


# The stack, run


class Stack:
    """compose's services as plain processes: the same commands, environments, working
    directories, secrets and health checks, with compose's hosts replaced by the test's servers."""

    def __init__(self, model: dict[str, Any], shell: dict[str, str], places: dict[str, str], root: Path) -> None:
        self.services, self.places, self.root = model["services"], places, root
        self.pattern = re.compile("|".join(map(re.escape, places)))  # one pass: a replacement stays
        # Each service's secrets as compose gives them: a file of the variable's value, none when it is empty
        for service, spec in self.services.items():
            for mount in spec.get("secrets", []):
                value = shell.get(model["secrets"][mount["source"]]["environment"], "")
                path = self.secrets(service) / Path(mount["target"]).name
                path.parent.mkdir(parents=True, exist_ok=True)
                if value:
                    path.write_text(value)

    def secrets(self, service: str) -> Path:
        return self.root / "secrets" / service

    def local(self, word: str, service: str) -> str:
        word = unescaped(word).replace("/run/secrets/", f"{self.secrets(service)}/")
        return self.pattern.sub(lambda m: self.places[m[0]], word)

    def argv(self, words: list[str], service: str) -> list[str]:
        words = [self.local(w, service) for w in words]
        venv = Path(sys.executable).parent / words[0]
        program = sys.executable if words[0] == "python" else str(venv) if venv.exists() else shutil.which(words[0])
        assert program, f"{words[0]} is not installed here"
        return [program, *words[1:]]

    def env(self, service: str) -> dict[str, str]:
        base = {k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR") if k in os.environ}
        # The image's ENV, and its programs first on the PATH (a shell command's `celery`)
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
        env = {**base, "PATH": path, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        env.update(
            {k: self.local(str(v), service) for k, v in (self.services[service].get("environment") or {}).items()}
        )
        if "RATCHET_DATABASE_URL" in env:
            env["RATCHET_SWEEP_SECONDS"] = "0.5"  # the workers sweep this often: quick to see
        return env

    def cwd(self, service: str) -> Path:
        spec = self.services[service]
        mounts = {m["target"]: m["source"] for m in spec.get("volumes") or []}
        return Path(self.local(mounts[spec["working_dir"]], service)) if "working_dir" in spec else self.root

    def health(self, service: str, pg: str, redis_port: int) -> list[str]:
        words = self.argv(self.services[service]["healthcheck"]["test"][1:], service)
        url = make_url(pg)
        extra = {"redis": ["-p", str(redis_port)], "postgres": ["-h", str(url.host), "-p", str(url.port or 5432)]}
        return [words[0], *extra.get(service, []), *words[1:]]


def http(port: int, path: str, *, auth: str | None = None, body: dict[str, Any] | None = None) -> tuple[int, str]:
    """(status, body) of a request to 127.0.0.1:`port`; `auth` is the Authorization header."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="GET" if data is None else "POST")
    if auth:
        req.add_header("Authorization", auth)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def flower(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    status, said = http(port, path, auth="Basic " + b64encode(FLOWER_AUTH.encode()).decode(), body=body)
    assert status == 200, (status, said)
    return json.loads(said)


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
    code = tmp_path / "project"  # the sample project, where its compose file mounts it from
    shutil.copytree(SAMPLE, code)
    shell = {"RATCHET_API_TOKENS": API_TOKEN, "FLOWER_PASSWORD": FLOWER_PASSWORD}
    model = render([SAMPLE / "compose.yaml"], shell, env_files=[SCRIPTED_ENV])
    # The secrets' values as compose reads them: the shell's over the env file's (a canary for the key)
    shell |= env_file(SCRIPTED_ENV) | {"OPENAI_API_KEY": CANARY}
    ports = {"model": free_port(), "flower": free_port(), "api": free_port()}
    compose = Stack(
        model,
        shell,
        {
            "postgresql://ratchet:ratchet@postgres:5432/ratchet": empty_pg_url,
            "redis://redis:6379/0": broker.url,
            "http://model:8765": f"http://127.0.0.1:{ports['model']}",
            "0.0.0.0": "127.0.0.1",
            "8765": str(ports["model"]),
            "5555": str(ports["flower"]),
            "8000": str(ports["api"]),
            str(SAMPLE): str(code),
        },
        tmp_path,
    )
    services = [s for s, spec in model["services"].items() if ours(spec) and s != "migrate"]
    assert sorted(services) == sorted(["model", "api", *WORKERS, "flower"])
    # Watching from before the first process starts: nothing it sends goes unseen.
    watch = BrokerWatch(broker.port).start()
    migrate = compose.argv(model["services"]["migrate"]["command"], "migrate")
    assert subprocess.run(migrate, env=compose.env("migrate"), cwd=tmp_path, timeout=60).returncode == 0
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {s: tmp_path / f"{s}.log" for s in services}
    try:
        for service in services:
            with logs[service].open("wb") as out:
                procs[service] = subprocess.Popen(
                    compose.argv(model["services"][service]["command"], service),
                    env=compose.env(service),
                    cwd=compose.cwd(service),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        checks = {s: compose.health(s, empty_pg_url, broker.port) for s in model["services"]}
        wait_until(
            lambda: len(flower(ports["flower"], "/api/workers?refresh=1")) >= len(WORKERS),
            90,
            what="flower to see the workers",
            interval=0.2,
            ignore=(OSError, ValueError, AssertionError),
        )
        wait_healthy(checks, compose, timeout=60)
        # A producer as `docker compose exec worker-control ratchet ...` runs it
        yield {
            "compose": compose,
            "env": compose.env("worker-control"),
            "cwd": compose.cwd("worker-control"),
            "ports": ports,
            "logs": logs,
            "broker": broker,
            "watch": watch,
        }
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


def wait_healthy(checks: dict[str, list[str]], compose: Stack, timeout: float) -> None:
    """Run the health checks still failing, all at once, until every one has passed (as compose
    waits for `service_healthy`)."""
    deadline, failing = time.monotonic() + timeout, dict(checks)
    while failing:
        running = {
            s: subprocess.Popen(
                argv, env=compose.env(s), cwd=compose.cwd(s), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            for s, argv in failing.items()
        }
        said = {s: proc.communicate(timeout=60)[0].decode(errors="replace") for s, proc in running.items()}
        failing = {s: checks[s] for s, proc in running.items() if proc.returncode != 0}
        assert time.monotonic() < deadline or not failing, {s: said[s] for s in failing}


@pytest.mark.slow
@pytest.mark.timeout(240)  # seven processes start, and a round of nine health checks runs at once
def test_compose_services_run_runs_end_to_end_and_flower_shows_them_without_secrets(stack: dict[str, Any]) -> None:
    env, ports = stack["env"], stack["ports"]
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("RATCHET_") and k != "RATCHET_APP"})

    # `ratchet health` on the whole: the database, the broker, each default queue consumed
    whole = subprocess.run(
        stack["compose"].argv(["ratchet", "health", "--timeout", "1"], "worker-control"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert re.search(r"workers\s+ok\s+3 answered: control@\S+, model@\S+, tools@\S+", whole.stdout), whole.stdout

    # From the command line
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "ratchet"), "run", AGENT, "hello", "--wait", "--timeout", "60"],
        env=env,
        cwd=stack["cwd"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    run_id = cli.stdout.splitlines()[0].strip()
    assert f"run {run_id}  COMPLETED" in cli.stdout

    # Flower shows each step by task name, with the run id in its arguments
    tasks = wait_until(
        lambda: (
            (t := flower(ports["flower"], "/api/tasks"))
            and {v["name"] for v in t.values() if run_id in str(v.get("args"))}
            >= {"ratchet.model_call", "ratchet.tool_batch"}
            and t
        ),
        60,
        what="flower to list the run's steps",
        interval=0.2,
        ignore=(OSError, ValueError),
    )
    assert any(k.startswith(run_id) for k in tasks)
    assert http(ports["flower"], "/api/tasks")[0] == 401  # no password, no tasks

    assert_the_api_runs_a_run_with_the_token_from_its_secret(ports["api"])

    # From HTTP: Flower's send-task starts a run by task name with JSON arguments
    http_run = str(uuid.uuid4())
    body = {"args": [AGENT, "from http", None, http_run], "queue": "ratchet.control"}
    assert flower(ports["flower"], "/api/task/send-task/ratchet.start_run", body).get("task-id")
    out = Client(settings).wait(
        wait_until(lambda: _exists(settings, http_run), 60, what="the HTTP run to exist", ignore=(RunNotFoundError,)),
        timeout=60,
    )
    assert out.status == RunStatus.COMPLETED and out.messages[1].content == "from http"

    # The workers sweep, one of them at a time: a run whose step was never published (its
    # producer died after writing it) completes, and only a sweep publishes it
    orphan = _run_never_published(settings)
    assert Client(settings).wait(orphan, timeout=30).status == RunStatus.COMPLETED
    logs = {name: stack["logs"][name].read_text(errors="replace") for name in WORKERS}
    swept = [n for n, text in logs.items() if re.search(rf"sweep: requeued \[\], republished \[[^\]]*'{orphan}'", text)]
    assert swept and all("took the sweep lease, and sweeps" in logs[name] for name in swept)
    assert "ratchet.sweep[" not in "".join(logs.values())  # a pass of a worker's thread, not a task
    assert_no_secret_anywhere(stack, env, (CANARY, API_TOKEN, FLOWER_PASSWORD))


def assert_the_api_runs_a_run_with_the_token_from_its_secret(port: int) -> None:
    """The API takes its token from the file its secret is (RATCHET_API_TOKENS_FILE), refuses
    requests without it, starts a run the workers complete, and serves /metrics."""
    bearer = f"Bearer {API_TOKEN}"
    assert http(port, "/health")[0] == 200  # its health check: no token needed
    assert http(port, "/runs", body={"agent": AGENT, "input": "x"})[0] == 401
    assert http(port, "/runs", auth="Bearer not-the-token", body={"agent": AGENT, "input": "x"})[0] == 401
    status, said = http(port, "/runs", auth=bearer, body={"agent": AGENT, "input": "from the api"})
    assert status == 202, said
    run_id = json.loads(said)["run_id"]
    status, said = http(port, f"/runs/{run_id}/wait?timeout=60", auth=bearer)
    run = json.loads(said)
    assert status == 200 and run["status"] == "COMPLETED", said
    assert run["messages"][1]["content"] == "from the api" and "found" in said  # the tool ran
    assert http(port, "/metrics")[0] == 401
    status, metrics = http(port, "/metrics", auth=bearer)
    assert status == 200 and re.search(rf'ratchet_runs\{{agent="{AGENT}",status="COMPLETED"\}} [1-9]', metrics), metrics


def assert_no_secret_anywhere(stack: dict[str, Any], env: dict[str, str], secrets: tuple[str, ...]) -> None:
    """No secret reached Flower, the broker, the database or any log."""
    tasks = json.dumps(flower(stack["ports"]["flower"], "/api/tasks"))
    stack["watch"].stop()
    engine = create_engine(env["RATCHET_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1))
    with engine.connect() as conn:
        tables = ("ratchet_runs", "ratchet_messages", "ratchet_events", "ratchet_sessions")
        dumps = {table: str(conn.execute(text(f"select * from {table}")).fetchall()) for table in tables}
    engine.dispose()
    logs = {name: log.read_text(errors="replace") for name, log in stack["logs"].items()}
    for secret in secrets:
        assert secret not in tasks
        assert_not_in_broker(stack["watch"], stack["broker"], secret)
        assert not [table for table, dump in dumps.items() if secret in dump]
        assert not [name for name, log in logs.items() if secret in log]


def assert_not_in_broker(watch: BrokerWatch, broker: RedisServer, secret: str) -> None:
    """The secret was in no command the broker ran (messages queued, events published), no
    pub/sub message, and no value left in it (the watch stopped)."""
    with broker.client() as r:
        left = [
            f"{k.decode(errors='replace')}: {v[:300].decode(errors='replace')}"
            for k, v in key_values(r)
            if holds(v, secret)
        ]
    leaks = {**watch.leaks(secret), "keys": left}
    assert not any(leaks.values()), f"a secret went through the broker: {leaks}"
    assert len(watch.commands) > 100 and watch.published, "the watch saw nothing: it cannot have seen a leak"


def _run_never_published(settings: Settings) -> str:
    """A QUEUED run due for publishing now, whose step no one published."""
    run_id = str(uuid.uuid4())
    Store.open(settings.database_url, auto_migrate=False).create_run(
        run_id=run_id,
        session_id=f"s-{run_id}",
        agent_name=AGENT,
        kind="agent",
        input_messages=[Message(role="user", content="orphan")],
        publish_grace=0,
    )
    return run_id


def _exists(settings: Settings, run_id: str) -> str | None:
    Client(settings).get_run(run_id)
    return run_id
