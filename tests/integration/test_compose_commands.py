"""compose.yaml, read and run as the plain processes it would start (no Docker engine here).

The file's promises, read from it: every service has a health check of its own; Flower needs a
password the user sets; the scripted model runs only under its profile, and only
compose.scripted.env points the workers at it; a control worker takes the control queue alone;
the agents' code reaches the workers from a mounted folder, their working directory.

The stack, run: each service's command, environment and working directory as compose gives them
(with `--profile scripted --env-file compose.scripted.env`), the hosts of compose's network
replaced by a Redis of the test's own, an empty PostgreSQL database and free ports. Every
service's health check passes; a run goes through from the CLI and from HTTP (Flower's
send-task); Flower shows the steps by name with their run ids; the workers' sweeper (no beat:
every worker sweeps, one at a time) recovers a run nothing else would; and the API key reaches
none of Flower, Redis (its keys, the messages that went through it, its pub/sub events), the
database or the logs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import create_engine, make_url, text

from orchestrator import Client, RunNotFoundError, RunStatus
from orchestrator.messages import Message
from orchestrator.settings import Settings
from orchestrator.store import Store, forget_stores
from orchestrator.testing.waiting import wait_until
from tests.integration.broker_watch import BrokerWatch, holds, key_values
from tests.isolation import PgDatabases
from tests.servers import RedisServer, free_port

ROOT = Path(__file__).resolve().parents[2]
SERVICES: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
SCRIPTED_ENV = ROOT / "compose.scripted.env"
CANARY = f"sk-canary-{uuid.uuid4().hex}"
FLOWER_PASSWORD = "test-password"
FLOWER_AUTH = f"ratchet:{FLOWER_PASSWORD}"
#: The user's agents, in a folder of their own (RATCHET_CODE), imported from the working directory.
USER_MODULE = "user_agents"
WORKERS = ("worker-model", "worker-tools", "worker-control")


class MissingVariable(Exception):
    """compose's `${VAR:?message}` with VAR unset or empty: compose refuses to start."""


def expand(word: str, env: dict[str, str]) -> str:
    """compose's interpolation: `${VAR}`, `${VAR:-default}`, `${VAR:?message}` and `$$`."""

    def value(m: re.Match[str]) -> str:
        if m[0] == "$$":
            return "$"
        found = env.get(m["name"]) or ""
        if m["op"] == ":?" and not found:
            raise MissingVariable(f"required variable {m['name']} is missing a value: {m['arg']}")
        return found or (m["arg"] if m["op"] == ":-" else "")

    return re.sub(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:[-?])(?P<arg>[^}]*))?\}", value, word)


def env_file(path: Path) -> dict[str, str]:
    """A compose env file's variables."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def ours(service: str) -> bool:
    """A service that runs Ratchet's image (not Redis or PostgreSQL)."""
    return "RATCHET_IMAGE" in str(SERVICES[service].get("image"))


def environment(service: str, shell: dict[str, str]) -> dict[str, str]:
    return {k: expand(str(v), shell) for k, v in (SERVICES[service].get("environment") or {}).items()}


def queues_of(service: str) -> list[str]:
    words = SERVICES[service]["command"]
    return words[words.index("-Q") + 1].split(",")


# The file's promises


def test_every_service_has_a_health_check_of_its_own() -> None:
    for name, spec in SERVICES.items():
        check = spec.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no health check"
        assert check["test"][0] == "CMD", name
    # Each worker's check asks that worker only (its node name) for the queue it consumes
    for name in [s for s in SERVICES if s.startswith("worker-")]:
        words, test = SERVICES[name]["command"], SERVICES[name]["healthcheck"]["test"]
        node = words[words.index("-n") + 1]
        assert test[1:5] == ["ratchet", "health", "--check", "workers"], name
        assert test[test.index("--destination") + 1] == node and node.endswith("@%h"), name
        assert test[test.index("--queue") + 1] == ",".join(queues_of(name)), name
    # No beat to check: every worker sweeps (one at a time), and none is told not to
    assert "beat" not in SERVICES
    assert all("RATCHET_WORKER_SWEEPS" not in environment(s, {}) for s in SERVICES if s.startswith("worker-"))
    assert SERVICES["migrate"]["healthcheck"]["test"][1:] == ["ratchet", "health", "--check", "database"]


def test_flower_needs_a_password_the_user_sets() -> None:
    auth = SERVICES["flower"]["environment"]["FLOWER_BASIC_AUTH"]
    assert expand(auth, {"FLOWER_PASSWORD": "s3cret"}) == "ratchet:s3cret"
    for unset in ({}, {"FLOWER_PASSWORD": ""}):
        with pytest.raises(MissingVariable, match="FLOWER_PASSWORD"):
            expand(auth, unset)
    assert not re.search(r"FLOWER_PASSWORD:?-", (ROOT / "compose.yaml").read_text()), "a default password"


def test_the_scripted_model_runs_only_under_its_profile_and_a_real_key_talks_to_the_real_api() -> None:
    scripted = env_file(SCRIPTED_ENV)
    assert SERVICES["model"]["profiles"] == ["scripted"] and scripted["COMPOSE_PROFILES"] == "scripted"
    assert "model:8765" not in (ROOT / "compose.yaml").read_text()  # only the env file names it
    calling = [s for s in SERVICES if "OPENAI_API_KEY" in (SERVICES[s].get("environment") or {})]
    assert sorted(calling) == ["worker-gpu", "worker-model", "worker-tools"]
    for service in calling:
        real = environment(service, {"OPENAI_API_KEY": "sk-real"})
        assert real["OPENAI_BASE_URL"] == "https://api.openai.com/v1" and real["OPENAI_API_KEY"] == "sk-real"
        assert environment(service, scripted)["OPENAI_BASE_URL"] == "http://model:8765/v1"
    # Nothing else is given a key or a model endpoint
    for service in set(SERVICES) - set(calling):
        assert not {"OPENAI_API_KEY", "OPENAI_BASE_URL"} & set(SERVICES[service].get("environment") or {}), service


def test_a_control_worker_takes_the_control_queue_alone() -> None:
    assert queues_of("worker-control") == ["ratchet.control"]
    consumers = [s for s in SERVICES if s.startswith("worker-") and "ratchet.control" in queues_of(s)]
    assert consumers == ["worker-control"]  # no start, continue or sweep waits behind a tool batch
    assert queues_of("worker-model") == ["ratchet.model"] and queues_of("worker-tools") == ["ratchet.tools"]
    assert "--autoscale" not in SERVICES["worker-control"]["command"]


def test_the_users_code_reaches_the_workers_from_a_mounted_folder() -> None:
    for service in [s for s in SERVICES if s.startswith("worker-")]:
        spec = SERVICES[service]
        (mount,) = spec["volumes"]
        source, target, mode = expand(mount, {"RATCHET_CODE": "/home/me/project"}).split(":")
        assert (source, target, mode) == ("/home/me/project", spec["working_dir"], "ro"), service
        assert expand(mount, {}).split(":")[0] == "."  # by default the folder compose.yaml is in
        assert environment(service, {"RATCHET_APP": "myproject.agents"})["RATCHET_APP"] == "myproject.agents"
        assert "--app" not in spec["command"]  # RATCHET_APP, which `celery -A workers.celery.app worker` reads too


# The stack, run


class Stack:
    """compose's services as plain processes: the same commands, environments, working
    directories and health checks, with compose's hosts replaced by the test's servers."""

    def __init__(self, shell: dict[str, str], places: dict[str, str]) -> None:
        self.shell, self.places = shell, places
        self.pattern = re.compile("|".join(map(re.escape, places)))  # one pass: a replacement stays

    def local(self, word: str) -> str:
        return self.pattern.sub(lambda m: self.places[m[0]], expand(word, self.shell))

    def argv(self, words: list[str]) -> list[str]:
        words = [self.local(w) for w in words]
        venv = Path(sys.executable).parent / words[0]
        program = sys.executable if words[0] == "python" else str(venv) if venv.exists() else shutil.which(words[0])
        assert program, f"{words[0]} is not installed here"
        return [program, *words[1:]]

    def env(self, service: str) -> dict[str, str]:
        base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
        env = {**base, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}  # the image's ENV
        env.update({k: self.local(v) for k, v in environment(service, self.shell).items()})
        if "RATCHET_DATABASE_URL" in env:
            env["RATCHET_SWEEP_SECONDS"] = "0.5"  # the workers sweep this often: quick to see
        return env

    def cwd(self, service: str, default: Path) -> Path:
        spec = SERVICES[service]
        mounts = dict(reversed(expand(v, self.shell).split(":")[:2]) for v in spec.get("volumes") or [])
        return Path(mounts[spec["working_dir"]]) if "working_dir" in spec else default

    def health(self, service: str, pg: str, redis_port: int) -> list[str]:
        words = self.argv(SERVICES[service]["healthcheck"]["test"][1:])
        url = make_url(pg)
        extra = {"redis": ["-p", str(redis_port)], "postgres": ["-h", str(url.host), "-p", str(url.port or 5432)]}
        return [words[0], *extra.get(service, []), *words[1:]]


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
    code = tmp_path / "code"  # the user's project: RATCHET_CODE, mounted at the working directory
    code.mkdir()
    shutil.copy(ROOT / "tests" / "integration" / "compose_agents.py", code / f"{USER_MODULE}.py")
    shell = {**env_file(SCRIPTED_ENV), "RATCHET_APP": USER_MODULE, "RATCHET_CODE": str(code),
             "FLOWER_PASSWORD": FLOWER_PASSWORD, "OPENAI_API_KEY": CANARY}  # fmt: skip
    model_port, flower_port = free_port(), free_port()
    compose = Stack(shell, {
        "postgresql://ratchet:ratchet@postgres:5432/ratchet": empty_pg_url, "redis://redis:6379/0": broker.url,
        "http://model:8765": f"http://127.0.0.1:{model_port}", "0.0.0.0": "127.0.0.1", "8765": str(model_port),
        "5555": str(flower_port),
    })  # fmt: skip
    profiles = set(shell["COMPOSE_PROFILES"].split(","))
    chosen = [s for s in SERVICES if set(SERVICES[s].get("profiles", profiles)) & profiles]  # compose's choice
    services = [s for s in chosen if ours(s) and s != "migrate"]
    assert services == ["model", *WORKERS, "flower"]
    # Watching from before the first process starts: nothing it sends goes unseen.
    watch = BrokerWatch(broker.port).start()
    migrate = compose.argv(SERVICES["migrate"]["command"])
    assert subprocess.run(migrate, env=compose.env("migrate"), cwd=tmp_path, timeout=60).returncode == 0
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {s: tmp_path / f"{s}.log" for s in services}
    try:
        for service in services:
            with logs[service].open("wb") as out:
                procs[service] = subprocess.Popen(
                    compose.argv(SERVICES[service]["command"]), env=compose.env(service),
                    cwd=compose.cwd(service, tmp_path), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                )  # fmt: skip
        checks = {s: compose.health(s, empty_pg_url, broker.port) for s in SERVICES if s in [*services, "migrate",
                  "redis", "postgres"]}  # fmt: skip
        wait_until(
            lambda: len(json.loads(flower_get(flower_port, "/api/workers?refresh=1"))) >= len(WORKERS),
            90, what="flower to see the workers", interval=0.2, ignore=(OSError, ValueError),
        )  # fmt: skip
        wait_healthy(checks, compose, tmp_path, timeout=60)
        # A producer as `docker compose exec worker-control ratchet ...` runs it
        yield {"compose": compose, "env": compose.env("worker-control"), "cwd": compose.cwd("worker-control", tmp_path),
               "flower_port": flower_port, "logs": logs, "broker": broker, "watch": watch}  # fmt: skip
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


def wait_healthy(checks: dict[str, list[str]], compose: Stack, tmp_path: Path, timeout: float) -> None:
    """Run the health checks still failing, all at once, until every one has passed (as compose
    waits for `service_healthy`)."""
    deadline, failing = time.monotonic() + timeout, dict(checks)
    while failing:
        running = {s: subprocess.Popen(argv, env=compose.env(s), cwd=compose.cwd(s, tmp_path), stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT) for s, argv in failing.items()}  # fmt: skip
        said = {s: proc.communicate(timeout=60)[0].decode(errors="replace") for s, proc in running.items()}
        failing = {s: checks[s] for s, proc in running.items() if proc.returncode != 0}
        assert time.monotonic() < deadline or not failing, {s: said[s] for s in failing}


@pytest.mark.slow
def test_compose_services_run_a_run_end_to_end_and_flower_shows_it_without_secrets(stack: dict[str, Any]) -> None:
    env, port = stack["env"], stack["flower_port"]
    settings = Settings.from_env({k: v for k, v in env.items() if k.startswith("RATCHET_") and k != "RATCHET_APP"})

    # `ratchet health` on the whole: the database, the broker, each default queue consumed
    whole = subprocess.run(stack["compose"].argv(["ratchet", "health", "--timeout", "1"]), env=env,
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert whole.returncode == 0, whole.stdout + whole.stderr
    assert re.search(r"workers\s+ok\s+3 answered: control@\S+, model@\S+, tools@\S+", whole.stdout), whole.stdout

    # From the command line
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "ratchet"), "run", "compose-agent", "hello", "--wait", "--timeout", "60"],
        env=env, cwd=stack["cwd"], capture_output=True, text=True, timeout=90,
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

    # The workers sweep, one of them at a time: a run whose step was never published (its
    # producer died after writing it) completes, and only a sweep publishes it
    orphan = _run_never_published(settings)
    assert Client(settings).wait(orphan, timeout=30).status == RunStatus.COMPLETED
    logs = {name: stack["logs"][name].read_text(errors="replace") for name in WORKERS}
    swept = [n for n, text in logs.items() if re.search(rf"sweep: requeued \[\], republished \[[^\]]*'{orphan}'", text)]
    assert swept and all("took the sweep lease, and sweeps" in logs[name] for name in swept)
    assert "ratchet.sweep[" not in "".join(logs.values())  # a pass of a worker's thread, not a task
    assert_no_secret_anywhere(stack, env)


def assert_no_secret_anywhere(stack: dict[str, Any], env: dict[str, str]) -> None:
    """The API key reached neither Flower, nor the broker, nor the database, nor any log."""
    assert CANARY not in flower_get(stack["flower_port"], "/api/tasks")
    assert_not_in_broker(stack["watch"], stack["broker"], CANARY)
    engine = create_engine(env["RATCHET_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1))
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
