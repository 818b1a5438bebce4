"""`ratchet health` says what is wrong, one line per check, and exits 1: no worker, a database
that is missing or not migrated, a broker that is down, a worker that does not answer, beat not
sending the sweep. (Healthy, exit 0, with every compose service's own check:
test_compose_commands.py.) The command runs as a plain process, as a compose healthcheck runs
it; the other cases call `check_health`, the same checks from Python, in this process, and
`GET /health/checks`, the same over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import Client
from orchestrator.errors import InvalidInputError
from orchestrator.settings import Settings
from orchestrator.store import forget_stores
from tests.conftest import PG_URL, make_settings, settings_env
from tests.integration.test_api import error_of
from tests.integration.test_api_records import call
from tests.isolation import PgDatabases
from tests.servers import RedisServer, free_port
from workers.api.routes import create_app
from workers.celery.app import MODEL_TASK
from workers.celery.app import create_app as create_celery
from workers.celery.beat import record_key
from workers.cli.commands import main
from workers.health import check_health

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own: a control broadcast on it reaches no other test's worker."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def health(settings: Settings, *args: str) -> subprocess.Popen[str]:
    """`ratchet health ARGS` started as a plain process with these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env.update(settings_env(settings), PYTHONPATH=str(ROOT), RATCHET_AUTO_MIGRATE="false")
    return subprocess.Popen([sys.executable, "-m", "workers.cli", "health", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def lines(proc: subprocess.Popen[str]) -> dict[str, str]:
    """A finished health process's lines, by check: "ok ..." or "FAILED ..."; it exited 1."""
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and not err, out + err
    return {name: rest.strip() for name, rest in (line.split(maxsplit=1) for line in out.splitlines())}


def test_ratchet_health_says_what_to_do_about_each_failed_check(pg_url: str, broker: RedisServer) -> None:
    missing_db = PG_URL.rsplit("/", 1)[0] + f"/ratchet_missing_{uuid.uuid4().hex[:8]}"
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    started = time.monotonic()
    # All at once: each waits on its own timeouts
    no_worker = health(make_settings(pg_url, broker.url), "--timeout", "1")
    no_database = health(make_settings(missing_db, broker.url), "--check", "database,broker")
    no_broker = health(make_settings(pg_url, down), "--timeout", "1")

    said = lines(no_worker)
    assert said["database"].startswith("ok") and "at migration" in said["database"]
    assert said["broker"].startswith("ok") and "answers PING; waiting: t." in said["broker"]
    assert said["workers"] == ("FAILED  no worker answered within 1s, 1 needed: start workers (`ratchet worker "
                               "--app MODULE`) on this RATCHET_BROKER_URL")  # fmt: skip

    said = lines(no_database)
    assert said["database"].startswith(f"FAILED  cannot query {missing_db}")
    assert "does not exist; is the database up, and RATCHET_DATABASE_URL right?" in said["database"]
    assert said["broker"].startswith("ok") and "workers" not in said

    said = lines(no_broker)
    assert said["database"].startswith("ok")
    assert said["broker"].startswith(f"FAILED  cannot reach Redis at {down}: ")
    assert "Connection refused" in said["broker"]
    assert said["broker"].endswith("; is it up, and RATCHET_BROKER_URL right?")
    assert said["workers"] == "FAILED  not checked: the broker did not answer"
    assert time.monotonic() - started < 30


def test_the_report_in_json(
    broker: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in settings_env(make_settings(f"sqlite:///{tmp_path / 'r.db'}", broker.url)).items():
        monkeypatch.setenv(name, value)
    assert main(["health", "--check", "broker,database", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] is False
    assert [(c["name"], c["ok"]) for c in report["checks"]] == [("database", False), ("broker", True)]
    assert report["checks"][1]["info"]["waiting"]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_database_check_wants_the_latest_migration(
    backend: str, tmp_path: Path, pg_databases: PgDatabases, broker: RedisServer
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'ratchet.db'}"
        (check,) = check_health(make_settings(url, broker.url), checks=["database"]).checks
        assert not check.ok and check.detail == f"no SQLite database at {tmp_path / 'ratchet.db'}: run `ratchet " \
            "migrate`, or fix RATCHET_DATABASE_URL"  # fmt: skip
        empty_url, drop = url, lambda: None
        Path(tmp_path / "ratchet.db").touch()
    else:
        empty_url, drop = pg_databases.create(migrated=False)
    try:
        (check,) = check_health(make_settings(empty_url, broker.url), checks=["database"]).checks
        assert not check.ok and check.detail.endswith(" has no Ratchet tables: run `ratchet migrate`")
        from orchestrator.store.database import migrate, open_engine

        engine = open_engine(empty_url)
        migrate(engine)
        engine.dispose()
        (check,) = check_health(make_settings(empty_url, broker.url), checks=["database"]).checks
        assert check.ok and check.info["revision"] and "(the latest)" in check.detail
    finally:
        forget_stores()
        drop()


def test_a_worker_that_does_not_answer_and_a_beat_that_sends_no_sweep_fail(broker: RedisServer, tmp_path: Path) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", broker.url)
    report = check_health(settings, checks=["workers", "beat"], destinations=["tools@%h"], timeout=0.5)
    workers, beat = report.checks
    assert not report.healthy and not workers.ok and not beat.ok
    assert workers.detail.startswith(f"worker tools@{os.uname().nodename} did not answer within 0.5s: is it running")
    assert beat.detail.startswith("beat has sent no sweep on this broker: start `ratchet beat`")
    # A worker's own check, with the broker down: it says so, in bounded time
    down = make_settings(settings.database_url, f"redis://127.0.0.1:{free_port()}/0")
    (workers,) = check_health(down, checks=["workers"], destinations=["tools@%h"], timeout=0.5).checks
    assert not workers.ok and workers.detail.startswith(f"cannot ask the workers through {down.broker_url}: ")

    # Beat's record (workers.celery.beat): recent passes, stale fails
    with broker.client() as r:
        r.set(record_key(settings), repr(time.time() - 1))
        (beat,) = check_health(settings, checks=["beat"]).checks
        assert beat.ok and beat.detail.startswith("sent the sweep 1.")
        r.set(record_key(settings), repr(time.time() - 120))
    (beat,) = check_health(settings, checks=["beat"], max_age=60).checks
    assert not beat.ok and beat.detail.startswith("beat last sent the sweep 120s ago (more than 60s; it sends one")
    assert beat.detail.endswith("is `ratchet beat` running?")


def test_unknown_checks_and_empty_queue_names_are_refused() -> None:
    settings = make_settings("sqlite:///x.db", "redis://127.0.0.1:1/0")
    known = "database, broker, workers, sweeper, beat"
    with pytest.raises(InvalidInputError, match=f"unknown check.* nope; known: {known}"):
        check_health(settings, checks=["nope"])
    with pytest.raises(InvalidInputError, match="queue is empty"):
        check_health(settings, queues=["ratchet.model", ""])


def test_the_http_api_answers_the_same_report_behind_its_token(pg_url: str, broker: RedisServer) -> None:
    settings = make_settings(pg_url, broker.url, api_tokens="t0k3n")
    app = create_app(settings, client=Client(settings))
    auth = {"Authorization": "Bearer t0k3n"}

    ok = call(app, "GET", "/health/checks", params={"check": "database,broker"}, headers=auth)
    assert ok.status_code == 200, ok.text
    assert ok.json()["healthy"] is True and [c["name"] for c in ok.json()["checks"]] == ["database", "broker"]
    assert ok.json()["checks"][1]["info"]["waiting"] == {settings.model_queue: 0, settings.tools_queue: 0,
                                                         settings.control_queue: 0}  # fmt: skip

    failed = call(app, "GET", "/health/checks", params={"timeout": "0.5"}, headers=auth)
    assert failed.status_code == 503 and failed.json()["healthy"] is False
    assert failed.json()["checks"][2]["detail"].startswith("no worker answered within 0.5s")

    error_of(call(app, "GET", "/health/checks", params={"check": "nope"}, headers=auth), 422, "InvalidInputError")
    # An empty name is no queue, worker or check to look for: refused, not counted as a queue named ""
    for empty in ({"queue": ""}, {"destination": ""}, {"check": "database,"}):
        refused = error_of(call(app, "GET", "/health/checks", params=empty, headers=auth), 422, "InvalidInputError")
        assert "is empty" in refused["message"] or "names no check" in refused["message"], refused
    assert call(app, "GET", "/health/checks").status_code == 401  # it names the database and workers
    assert call(app, "GET", "/health").status_code == 200  # liveness needs no token


def test_a_queues_length_is_the_sum_of_its_ten_priority_lists(broker: RedisServer, tmp_path: Path) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", broker.url)
    app = create_celery(settings)
    for priority in (None, 0, 3, 9, 9):  # no worker takes them
        app.send_task(MODEL_TASK, args=["r", 0], queue=settings.model_queue, priority=priority)
    app.close()
    with broker.client() as r:
        lists = {k for k in r.keys(f"{settings.model_queue}*") if r.type(k) == b"list"}
    assert len(lists) == 3  # the plain list (none, 0), step 3 and step 9

    (check,) = check_health(settings, checks=["broker"], queues=["gpu"]).checks
    assert check.info["waiting"] == {settings.model_queue: 5, settings.tools_queue: 0, settings.control_queue: 0,
                                     "gpu": 0}  # fmt: skip
