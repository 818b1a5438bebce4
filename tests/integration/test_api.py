"""The HTTP API, served by `ratchet api` in a uvicorn subprocess, called over HTTP as a client
would, with a real worker running the steps it starts, on SQLite and on PostgreSQL."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

import tests.integration.compose_agents  # noqa: F401  (the embedded worker runs its agent)
from orchestrator import Agent, Client, RunStatus
from orchestrator.catalog import write_served
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.store import Store, forget_stores
from orchestrator.store.database import migrate, open_engine
from orchestrator.store.tables import metadata
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings, settings_env
from tests.integration.producing import fail
from tests.isolation import BrokerLeftovers
from workers.api.serve import GRACEFUL_SHUTDOWN
from workers.celery.embedded import EmbeddedWorker

ROOT = Path(__file__).resolve().parents[2]
AGENT = "compose-agent"
APP = "tests.integration.compose_agents"
#: A small body limit for these servers, so the 413 cases send little.
BODY_LIMIT = 64 * 1024
#: What a POST or DELETE without a body says (the tokenless API takes no other: workers/api/loopback.py).
JSON = {"Content-Type": "application/json"}


@dataclass
class ApiServer:
    """A `ratchet api` process: its URL, and its log (stdout and stderr)."""

    url: str
    log: Path
    proc: subprocess.Popen[bytes]

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_api(
    settings: Settings, log: Path, *args: str, env: dict[str, str] | None = None, app: str = APP
) -> ApiServer:
    """Start `ratchet api` serving the agents of `app` with these settings on a free port; return
    once it takes requests."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **settings_env(settings), **(env or {})}
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "api", "--app", app, "--port", "0", *args],
        env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out.close()

    def listening() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"ratchet api exited with {proc.returncode}:\n{log.read_text()}")
        found = re.search(r"Uvicorn running on (http://\S+)", log.read_text())
        return found[1] if found else None

    try:
        url = wait_until(listening, 60, what="ratchet api to listen", interval=0.05)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return ApiServer(url=url, log=log, proc=proc)


@contextmanager
def module_database(request: pytest.FixtureRequest, kind: str, folder: Path) -> Iterator[str]:
    """The URL of a migrated database (`kind`: sqlite or postgres) for the tests of a module, dropped after them."""
    if kind == "sqlite":
        url = f"sqlite:///{folder / 'ratchet.db'}"
        engine = open_engine(url)
        try:
            migrate(engine)
        finally:
            engine.dispose()
        yield url
        forget_stores()
        return
    url, drop = request.getfixturevalue("pg_databases").create()
    try:
        yield url
    finally:
        forget_stores()
        drop()


@dataclass
class SharedApi:
    """A `ratchet api` server the tests of a module share, on a database and queues of the module's
    own. `fresh()`, before each test, puts every table back as it was when migrated and empties
    the queues, so no test meets a run, session, key, schedule, catalog row or message of one
    before it (a new database per test, as `db_url` gives, without a server start per test)."""

    server: ApiServer
    settings: Settings
    #: Each table's rows as migrated (the metric totals' mark: `orchestrator.store.metrics`).
    rows: dict[str, list[dict[str, Any]]]

    def fresh(self) -> Settings:
        """Reset the database and the queues (no worker may be running); returns the settings."""
        forget_stores()
        engine = open_engine(self.settings.database_url)
        try:
            with engine.begin() as conn:
                for table in reversed(metadata.sorted_tables):
                    conn.execute(table.delete())
                for table in metadata.sorted_tables:
                    if self.rows[table.name]:
                        conn.execute(table.insert(), self.rows[table.name])
        finally:
            engine.dispose()
        # The queues and their unacked entries, not kombu's bindings: the running server publishes through those
        BrokerLeftovers(self.settings.broker_url).delete([self.settings.model_queue.split(".")[1]], keep_bindings=True)
        return self.settings


@contextmanager
def shared_api(settings: Settings, log: Path, *args: str, **kwargs: Any) -> Iterator[SharedApi]:
    """`start_api` for a module's tests (see `SharedApi`); its queues' keys are deleted after them."""
    engine = open_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            rows = {t.name: [dict(r._mapping) for r in conn.execute(t.select())] for t in metadata.sorted_tables}
    finally:
        engine.dispose()
    server = start_api(settings, log, *args, **kwargs)
    try:
        yield SharedApi(server=server, settings=settings, rows=rows)
    finally:
        server.stop()
        BrokerLeftovers(settings.broker_url).delete([settings.model_queue.split(".")[1]])


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def module_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with module_database(request, request.param, tmp_path_factory.mktemp("db")) as url:
        yield url


@pytest.fixture(scope="module")
def shared(module_db_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedApi]:
    settings = make_settings(module_db_url, redis_url, api_max_body_bytes=BODY_LIMIT)
    with shared_api(settings, tmp_path_factory.mktemp("api") / "api.log") as served:
        yield served


@pytest.fixture
def api_settings(shared: SharedApi) -> Settings:
    """The module's server's settings, its database and queues emptied for this test."""
    return shared.fresh()


@pytest.fixture
def settings(api_settings: Settings) -> Settings:
    """The worker fixture's settings are the API server's."""
    return api_settings


@pytest.fixture
def api(shared: SharedApi, api_settings: Settings) -> ApiServer:
    return shared.server


def error_of(response: httpx.Response, status: int, type: str) -> dict[str, Any]:
    """The response is `status` with the error body (`workers.api.contract.ErrorBody`): JSON,
    naming `type`, saying what went wrong in `detail` and again in `error.message`."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json", response.headers
    body = response.json()
    error = body["error"]
    assert error["type"] == type and error["message"] and body["detail"] == error["message"], body
    return dict(error)


def declared(schema: dict[str, Any], method: str, path: str) -> set[str] | None:
    """The statuses the schema states for the operation serving `method` `path` (None: no route serves it)."""
    for template, operations in schema["paths"].items():
        if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path):  # no other sign of a regex in them
            operation = operations.get(method.lower())
            return None if operation is None else set(operation["responses"])
    return None


@pytest.mark.usefixtures("scripted")
def test_a_run_is_started_waited_for_continued_and_listed_in_its_session(api: ApiServer, settings: Settings) -> None:
    with api.client() as http, ExitStack() as running:
        started = http.post("/runs", json={"agent": AGENT, "input": "find celery", "session_id": "api-s"})
        assert started.status_code == 202, started.text
        run_id = started.json()["run_id"]
        assert started.headers["location"] == f"/runs/{run_id}"
        assert [(m["role"], m["content"]) for m in started.json()["messages"]][-1] == ("user", "find celery")
        # The worker starts once the 202 is back: one already running may take the first step
        # before the server reads the run back for its answer (seen on a loaded machine)
        running.enter_context(EmbeddedWorker(settings))

        done = http.get(f"/runs/{run_id}/wait", params={"timeout": 30}).json()
        assert done["status"] == "COMPLETED" and done["session_id"] == "api-s"
        roles = [m["role"] for m in done["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        assert done["messages"][3]["content"] == "found find celery"
        # The run's token usage: its total and each model call's
        calls = [m["metrics"] for m in done["messages"] if m["role"] == "assistant"]
        assert done["metrics"]["input_tokens"] == sum(c["input_tokens"] for c in calls) > 0
        assert http.get(f"/runs/{run_id}").json() == done

        # Continuing a COMPLETED run forks it; cancelling it is refused
        fork = http.post(f"/runs/{run_id}/continue", json={"input": "and redis?"})
        assert fork.status_code == 202, fork.text
        fork_id = fork.json()["run_id"]
        assert fork_id != run_id and fork.json()["forked_from"] == run_id
        assert http.get(f"/runs/{fork_id}/wait", params={"timeout": 30}).json()["status"] == "COMPLETED"
        error_of(http.post(f"/runs/{run_id}/cancel", headers=JSON), 409, "RunNotContinuableError")

        session = http.get("/sessions/api-s/runs").json()
        assert session["session_id"] == "api-s"
        assert [r["run_id"] for r in session["runs"]] == [run_id, fork_id]
        assert session["metrics"]["output_tokens"] == sum(r["metrics"]["output_tokens"] for r in session["runs"]) > 0


def test_a_wait_that_times_out_answers_with_the_run_as_it_is(api: ApiServer) -> None:
    # No worker: the run stays QUEUED
    with api.client() as http:
        run_id = http.post("/runs", json={"agent": AGENT, "input": "hello"}).json()["run_id"]
        waited = http.get(f"/runs/{run_id}/wait", params={"timeout": 0.2})
        assert waited.status_code == 200 and waited.json()["status"] == "QUEUED"


def test_a_stopping_server_cuts_a_long_wait_after_its_grace_period(redis_url: str, tmp_path: Path) -> None:
    # Given a request that would wait five minutes for a run no worker takes, sent whole on a
    # connection the server has already answered on (SQLite: the database plays no part here)
    api = start_api(make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url), tmp_path / "api.log")
    try:
        with api.client() as http:
            run_id = http.post("/runs", json={"agent": AGENT, "input": "hello"}).json()["run_id"]
        host, port = api.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")
            conn.sendall(f"GET /runs/{run_id}/wait?timeout=300 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())

            # When the server is stopped
            stopping = time.monotonic()
            api.proc.send_signal(signal.SIGTERM)

            # Then it cuts the wait after its grace period and exits (by the signal, as uvicorn
            # does), not when the wait would end
            assert api.proc.wait(30) == -signal.SIGTERM
            assert GRACEFUL_SHUTDOWN <= time.monotonic() - stopping < GRACEFUL_SHUTDOWN + 5
            assert b"HTTP/1.1 200" not in conn.recv(4096)
    finally:
        api.stop()


@pytest.mark.usefixtures("worker", "scripted")
def test_the_same_idempotency_key_starts_one_run(api: ApiServer, api_settings: Settings) -> None:
    with api.client() as http:
        body = {"agent": AGENT, "input": "once", "session_id": "idem-s"}
        first = http.post("/runs", json=body, headers={"Idempotency-Key": "order-17"})
        again = http.post("/runs", json=body, headers={"Idempotency-Key": "order-17"})
        assert first.status_code == again.status_code == 202
        run_id = first.json()["run_id"]
        assert again.json()["run_id"] == run_id
        assert http.get(f"/runs/{run_id}/wait", params={"timeout": 30}).json()["status"] == "COMPLETED"
        # Sent again after the run completed: still that run, not a new one
        assert http.post("/runs", json=body, headers={"Idempotency-Key": "order-17"}).json()["run_id"] == run_id
        session = Client(api_settings).get_session("idem-s")
        assert session is not None and [r.run_id for r in session.runs] == [run_id]

        # The key with another request is a conflict, and starts nothing
        other_input = http.post("/runs", json={**body, "input": "twice"}, headers={"Idempotency-Key": "order-17"})
        assert run_id in error_of(other_input, 409, "RunConflictError")["message"]
        other_session = http.post(
            "/runs", json={**body, "session_id": "idem-t"}, headers={"Idempotency-Key": "order-17"}
        )
        error_of(other_session, 409, "RunConflictError")
        # Every field of the request counts: another priority, stream flag or state is another request
        for other, differs in [
            ({"priority": 3}, "priority=None"),
            ({"stream": True}, "stream=False"),
            ({"session_state": {"cart": 1}}, "another session_state"),
        ]:
            refused = http.post("/runs", json={**body, **other}, headers={"Idempotency-Key": "order-17"})
            message = error_of(refused, 409, "RunConflictError")["message"]
            assert "Idempotency-Key 'order-17'" in message and differs in message, message
        # Keys are per user: another user's same key starts a run of its own
        ada = http.post(
            "/runs", json={**body, "session_id": None, "user_id": "ada"}, headers={"Idempotency-Key": "order-17"}
        )
        assert ada.status_code == 202 and ada.json()["run_id"] != run_id and ada.json()["user_id"] == "ada"
        # Many at once with a new key: one run
        with ThreadPoolExecutor(8) as pool:
            racing = list(
                pool.map(lambda _: http.post("/runs", json=body, headers={"Idempotency-Key": "k-race"}), range(8))
            )
        assert {r.status_code for r in racing} == {202}
        assert len({r.json()["run_id"] for r in racing}) == 1
        # Another key is another run
        other_key = http.post("/runs", json=body, headers={"Idempotency-Key": "order-18"})
        assert other_key.status_code == 202 and other_key.json()["run_id"] != run_id
        assert Client(api_settings).get_session("idem-t") is None
        session = Client(api_settings).get_session("idem-s")
        assert session is not None and len(session.runs) == 3  # order-17, k-race, order-18


def test_a_run_started_with_a_priority_keeps_it(api: ApiServer, api_settings: Settings) -> None:
    with api.client() as http:
        started = http.post("/runs", json={"agent": AGENT, "input": "now", "priority": 8})
    assert started.status_code == 202 and started.json()["priority"] == 8
    assert Client(api_settings).get_run(started.json()["run_id"]).priority == 8


def test_cancel_and_the_continues_a_run_state_refuses(api: ApiServer, api_settings: Settings) -> None:
    # No worker: runs stay where the test puts them
    with api.client() as http:
        run_id = http.post("/runs", json={"agent": AGENT, "input": "hello"}).json()["run_id"]
        # A QUEUED run is going already: new input is refused
        error_of(http.post(f"/runs/{run_id}/continue", json={"input": "more"}), 409, "RunBusyError")

        cancelled = http.post(f"/runs/{run_id}/cancel", headers=JSON)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"
        assert http.post(f"/runs/{run_id}/cancel", headers=JSON).json()["status"] == "CANCELLED"  # again: a no-op
        error_of(http.post(f"/runs/{run_id}/continue", headers=JSON), 409, "RunNotContinuableError")

        # A run in ERROR continues in place, without a body
        failed_id = http.post("/runs", json={"agent": AGENT, "input": "hello"}).json()["run_id"]
        fail(Client(api_settings).store, failed_id)
        assert http.get(f"/runs/{failed_id}").json()["error"] == {"type": "Boom", "message": "the step failed"}
        resumed = http.post(f"/runs/{failed_id}/continue", headers=JSON)
        assert resumed.status_code == 202, resumed.text
        assert resumed.json()["run_id"] == failed_id and resumed.json()["status"] == RunStatus.QUEUED


def test_a_start_the_broker_refuses_is_a_503_naming_the_run_it_saved(db_url: str, tmp_path: Path) -> None:
    settings = make_settings(db_url, "redis://127.0.0.1:1/0")  # nothing listens on port 1
    server = start_api(settings, tmp_path / "api.log")
    try:
        with server.client() as http:
            refused = http.post("/runs", json={"agent": AGENT, "input": "hello"}, headers={"Idempotency-Key": "b-1"})
            error = error_of(refused, 503, "BrokerUnavailableError")
            assert refused.headers["retry-after"] == "5"
            # The run is saved, and the same request again finds it
            assert Client(settings).get_run(error["run_id"]).status == RunStatus.QUEUED
            again = http.post("/runs", json={"agent": AGENT, "input": "hello"}, headers={"Idempotency-Key": "b-1"})
            assert again.status_code == 202 and again.json()["run_id"] == error["run_id"]
    finally:
        server.stop()


def test_a_start_takes_an_agent_only_a_worker_served_and_refuses_one_nobody_knows(
    api: ApiServer, api_settings: Settings
) -> None:
    # Given an agent this server's --app modules do not define, which a worker served days ago
    agent = Agent(name=f"api-served-{uuid.uuid4().hex[:6]}", model=OpenAIChat(id="gpt-4o-mini"))
    then = Store(open_engine(api_settings.database_url), clock=lambda: time.time() - 3 * 86400)
    try:
        write_served(then, [agent])
    finally:
        then.dispose()

    with api.client() as http:
        # When it is started through the API, the run is written, waiting for a worker (as `ratchet run`)
        taken = http.post("/runs", json={"agent": agent.name, "input": "hello"})
        # and an agent no module defines and no worker served is a 404, with nothing written
        unknown = f"nobody-{uuid.uuid4().hex[:6]}"
        refused = http.post("/runs", json={"agent": unknown, "input": "hello"})

    assert taken.status_code == 202, taken.text
    assert Client(api_settings).get_run(taken.json()["run_id"]).status == RunStatus.QUEUED
    assert "no worker has served it" in error_of(refused, 404, "AgentNotFoundError")["message"]
    assert Client(api_settings).list_runs(agent=unknown).runs == []


def raw(body: bytes | Iterator[bytes]) -> dict[str, Any]:
    """Request arguments that send `body` as it is, as JSON (an iterator: chunked, no Content-Length)."""
    return {"content": body, "headers": {"content-type": "application/json"}}


def mistakes() -> list[tuple[str, str, dict[str, Any], int, str]]:
    """(method, path, request arguments, status, error type): a user's mistake, and the answer."""
    chunked = iter([b'{"agent": "compose-agent", "input": "', *[b"x" * 4096] * 20, b'"}'])
    long_key = {"Idempotency-Key": "k" * 300}
    return [
        ("POST", "/runs", {"json": {"agent": "no-such-agent", "input": "hi"}}, 404, "AgentNotFoundError"),
        ("GET", "/runs/no-such-run", {}, 404, "RunNotFoundError"),
        ("GET", "/runs/no-such-run/wait", {}, 404, "RunNotFoundError"),
        ("POST", "/runs/no-such-run/continue", {"headers": JSON}, 404, "RunNotFoundError"),
        ("POST", "/runs/no-such-run/cancel", {"headers": JSON}, 404, "RunNotFoundError"),
        ("GET", "/runs/no-such-run/events", {}, 404, "RunNotFoundError"),
        ("GET", "/sessions/no-such-session/runs", {}, 404, "SessionNotFound"),
        ("GET", "/no-such-endpoint", {}, 404, "HTTPError"),
        ("DELETE", "/runs/r1", {"headers": JSON}, 405, "HTTPError"),
        ("POST", "/runs", raw(b'{"agent": '), 422, "RequestValidationError"),
        ("POST", "/runs", raw(b'{"agent": "compose-agent", "input": "\xff\xfe"}'), 422, "RequestValidationError"),
        ("POST", "/runs", raw(b"[" * 20_000 + b"]" * 20_000), 422, "RequestValidationError"),
        (
            "POST",
            "/runs",
            {"json": {"agent": AGENT, "input": "hi"}, "headers": {"Idempotency-Key": ""}},
            422,
            "InvalidInputError",
        ),
        ("POST", "/runs", {"json": ["agent", "input"]}, 422, "RequestValidationError"),
        ("POST", "/runs", {"json": {"agent": AGENT}}, 422, "RequestValidationError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": 7}}, 422, "RequestValidationError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": "hi", "urgency": 1}}, 422, "RequestValidationError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": "hi", "priority": 10}}, 422, "RequestValidationError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": "hi", "priority": "9"}}, 422, "RequestValidationError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": "   "}}, 422, "InvalidInputError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": "a\x00b"}}, 422, "InvalidInputError"),
        ("POST", "/runs", raw(b'{"agent": "compose-agent", "input": "\\ud800"}'), 422, "InvalidInputError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": "hi", "session_id": "s\x07"}}, 422, "InvalidInputError"),
        ("POST", "/runs", {"json": {"agent": "a" * 300, "input": "hi"}}, 422, "InvalidInputError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": "hi"}, "headers": long_key}, 422, "InvalidInputError"),
        ("GET", "/runs/" + "r" * 65, {}, 422, "InvalidInputError"),
        ("GET", "/runs/r%00x", {}, 422, "InvalidInputError"),
        ("POST", "/runs/r1/continue", {"json": {"input": ""}}, 422, "InvalidInputError"),
        ("POST", "/runs/r1/continue", {"json": {"fork": "x"}}, 422, "RequestValidationError"),
        ("GET", "/runs/r1/wait", {"params": {"timeout": "soon"}}, 422, "RequestValidationError"),
        ("GET", "/runs/r1/wait", {"params": {"timeout": "0"}}, 422, "RequestValidationError"),
        ("GET", "/runs/r1/wait", {"params": {"timeout": "nan"}}, 422, "RequestValidationError"),
        ("GET", "/runs/r1/wait", {"params": {"timeout": "1e9"}}, 422, "RequestValidationError"),
        ("POST", "/runs", {"json": {"agent": AGENT, "input": "x" * BODY_LIMIT}}, 413, "ContentTooLarge"),
        ("POST", "/runs", raw(chunked), 413, "ContentTooLarge"),
        # Without tokens, what another site's page could send (`workers.api.loopback`)
        ("GET", "/runs/r1", {"headers": {"Host": "rebound.example"}}, 421, "MisdirectedRequest"),
        ("GET", "/runs/r1", {"headers": {"Origin": "https://elsewhere.example"}}, 403, "ForeignOrigin"),
        (
            "POST",
            "/runs/r1/cancel",
            {"content": b"", "headers": {"Content-Type": "text/plain"}},
            415,
            "UnsupportedMediaType",
        ),
    ]


def test_every_mistake_of_a_user_is_a_4xx_with_the_error_body_its_operation_declares(api: ApiServer) -> None:
    with api.client() as http:
        schema = http.get("/openapi.json").json()
        for method, path, kwargs, status, kind in mistakes():
            response = http.request(method, path, **kwargs)
            assert response.status_code == status, (method, path, response.status_code, response.text)
            error_of(response, status, kind)
            # Stated in the schema, but where no operation serves the request (a path or method unknown)
            statuses = declared(schema, method, path.partition("?")[0])
            assert statuses is None or str(status) in statuses, (method, path, status, statuses)
            assert statuses is not None or status in (404, 405), (method, path)
        # A method a path does not take: 405 naming every one it does, from whichever router
        assert http.delete("/runs/r1", headers=JSON).headers["allow"] == "GET"
        assert http.request("PATCH", "/sessions/s1", headers=JSON).headers["allow"] == "DELETE, GET"
    assert "Traceback" not in api.log.read_text()


def test_a_fault_of_the_server_is_a_500_with_the_error_body_and_its_traceback_in_the_log(
    redis_url: str, tmp_path: Path
) -> None:
    database = tmp_path / "ratchet.db"
    api = start_api(make_settings(f"sqlite:///{database}", redis_url), tmp_path / "api.log")
    try:
        with api.client() as http:
            run_id = http.post("/runs", json={"agent": AGENT, "input": "hello"}, headers=JSON).json()["run_id"]
            schema = http.get("/openapi.json").json()
            # When the store breaks under the running server
            with sqlite3.connect(database) as conn:
                conn.execute("ALTER TABLE ratchet_runs RENAME TO gone")
            failed = http.get(f"/runs/{run_id}")
            # Then the client gets the one error body, which says where to look, and nothing of the fault
            error = error_of(failed, 500, "InternalError")
            assert "its log says why" in error["message"] and "runs" not in error["message"]
            assert "500" in (declared(schema, "GET", f"/runs/{run_id}") or set())
    finally:
        api.stop()
    assert "Traceback" in api.log.read_text() and "no such table: ratchet_runs" in api.log.read_text()


def test_the_openapi_schema_is_served_and_names_every_endpoint(api: ApiServer) -> None:
    with api.client() as http:
        schema = http.get("/openapi.json").json()
    assert set(schema["paths"]) >= {
        "/runs", "/runs/{run_id}", "/runs/{run_id}/wait", "/runs/{run_id}/continue", "/runs/{run_id}/cancel",
        "/runs/{run_id}/events", "/sessions/{session_id}/runs", "/health",
    }  # fmt: skip
    assert "Idempotency-Key" in {p["name"].title() for p in schema["paths"]["/runs"]["post"]["parameters"]}
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    # A route whose own answer is a stream or plain text answers its errors in JSON, and says so
    for path, status in [("/metrics", "401"), ("/runs/{run_id}/events", "404"), ("/runs/{run_id}/events", "422")]:
        assert set(schema["paths"][path]["get"]["responses"][status]["content"]) == {"application/json"}, path


def test_without_tokens_it_listens_on_loopback_only_and_says_so(api: ApiServer, api_settings: Settings) -> None:
    assert "RATCHET_API_TOKENS is not set" in api.log.read_text()
    refused = subprocess.run(
        [sys.executable, "-m", "workers.cli", "api", "--app", APP, "--host", "0.0.0.0", "--port", "0"],
        env={**os.environ, "PYTHONPATH": str(ROOT), **settings_env(api_settings)}, capture_output=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "refusing to serve the API on '0.0.0.0' without authentication: set RATCHET_API_TOKENS" in (
        refused.stderr.decode()
    )


@pytest.mark.usefixtures("worker", "scripted")
def test_with_tokens_every_request_needs_one_and_no_token_is_logged(api_settings: Settings, tmp_path: Path) -> None:
    first, second = "tok-first-5f0c2e9a", "tok-second-77d1b3c4"
    server = start_api(api_settings, tmp_path / "api.log", env={"RATCHET_API_TOKENS": f"{first}, {second}"})
    try:
        with server.client() as anonymous, server.client(first) as one, server.client(second) as two:
            refused = anonymous.get("/runs/r1")
            assert refused.headers["www-authenticate"] == "Bearer"
            error_of(refused, 401, "Unauthorized")
            # Refused before the body is read: a malformed or oversized one is still a 401
            error_of(anonymous.post("/runs", **raw(b"{")), 401, "Unauthorized")
            error_of(anonymous.post("/runs", **raw(b"x" * (BODY_LIMIT + 1))), 401, "Unauthorized")
            with server.client("tok-first") as prefix:
                error_of(prefix.get("/runs/r1"), 401, "Unauthorized")
            basic = anonymous.get("/runs/r1", headers={"Authorization": f"Basic {first}"})
            error_of(basic, 401, "Unauthorized")
            assert anonymous.get("/health").status_code == 200
            assert anonymous.get("/openapi.json").status_code == 200

            started = one.post("/runs", json={"agent": AGENT, "input": "hello"})
            assert started.status_code == 202, started.text
            run_id = started.json()["run_id"]
            assert two.get(f"/runs/{run_id}/wait", params={"timeout": 30}).json()["status"] == "COMPLETED"
            error_of(two.get("/runs/no-such-run"), 404, "RunNotFoundError")
    finally:
        server.stop()
    log = server.log.read_text()
    assert "bearer-token auth is on: 2 token(s)" in log
    assert first not in log and second not in log
