"""Ratchet's API mounted in a FastAPI app of a user's own (`workers.api.mount`), served by a real
uvicorn in a subprocess as the user would serve their app: the API under its path with its token,
errors, docs and run pages, its start inside the user's lifespan, and the user's own routes and
errors left as they were."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from fastapi import FastAPI, Request

from orchestrator.settings import Settings
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings, settings_env
from tests.integration.test_api import AGENT, JSON, ROOT, ApiServer, error_of
from workers.api import mount

TOKEN = "mounted-token-8d2f"


def users_app() -> FastAPI:
    """The user's app (uvicorn's --factory calls it in the server's process): a lifespan and a
    route of its own, and Ratchet's API under /ratchet, its settings from the environment."""
    import tests.integration.compose_agents  # noqa: F401  (the agent a start names)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, str]]:
        yield {"greeting": "hello from the user's lifespan"}

    app = FastAPI(title="The user's app", lifespan=lifespan)

    @app.get("/hello")
    def hello(request: Request) -> dict[str, str]:
        return {"said": request.state.greeting}

    mount(app, "/ratchet", Settings.from_env())
    return app


def serve_users_app(settings: Settings, log: Path) -> ApiServer:
    """uvicorn serving `users_app` on a free port, once it takes requests."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **settings_env(settings), "RATCHET_API_TOKENS": TOKEN}
    out = log.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "tests.integration.test_api_mount:users_app", "--port", "0"],
        env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out.close()

    def listening() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"uvicorn exited with {proc.returncode}:\n{log.read_text()}")
        found = re.search(r"Uvicorn running on (http://\S+)", log.read_text())
        return found[1] if found else None

    return ApiServer(url=wait_until(listening, 60, what="the user's app to listen", interval=0.05), log=log, proc=proc)


@pytest.fixture
def served(redis_url: str, tmp_path: Path) -> Iterator[ApiServer]:
    server = serve_users_app(make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url), tmp_path / "app.log")
    yield server
    server.stop()


def test_the_api_mounted_in_a_users_app_serves_under_its_path_with_its_token_errors_and_docs(
    served: ApiServer,
) -> None:
    with served.client() as anonymous, served.client(TOKEN) as http:
        # The user's own route, with the state its lifespan gave: Ratchet's start ran beside it
        assert anonymous.get("/hello").json() == {"said": "hello from the user's lifespan"}
        # The API under /ratchet: liveness, the pages and the schema need no token; the rest does
        assert anonymous.get("/ratchet/health").json() == {"status": "ok"}
        assert anonymous.get("/ratchet/ui/").status_code == 200
        error_of(anonymous.get("/ratchet/runs"), 401, "Unauthorized")
        started = http.post("/ratchet/runs", json={"agent": AGENT, "input": "hello"}, headers=JSON)
        assert started.status_code == 202, started.text
        assert started.headers["location"] == f"/ratchet/runs/{started.json()['run_id']}"
        assert http.get(started.headers["location"]).json()["run_id"] == started.json()["run_id"]
        error_of(http.get("/ratchet/runs/no-such-run"), 404, "RunNotFoundError")
        error_of(http.get("/ratchet/no-such-endpoint"), 404, "HTTPError")
        error_of(http.get("/ratchet/runs", params={"limit": "many"}), 422, "RequestValidationError")
        # Its docs load its schema from under the path, and the schema says where it is served
        assert "'/ratchet/openapi.json'" in anonymous.get("/ratchet/docs").text
        schema = anonymous.get("/ratchet/openapi.json").json()
        assert (
            schema["servers"] == [{"url": "/ratchet"}] and schema["paths"]["/runs"]["post"]["operationId"] == "startRun"
        )
        # The user's own paths and errors are FastAPI's as before: Ratchet's shape stays under its path
        assert anonymous.get("/nowhere").json() == {"detail": "Not Found"}
        assert "/hello" in anonymous.get("/openapi.json").json()["paths"]


def test_a_mounted_api_whose_database_cannot_be_opened_stops_the_users_app_at_start(
    redis_url: str, tmp_path: Path
) -> None:
    # Given a database in a folder that is a file: it cannot be opened
    (tmp_path / "not-a-folder").write_text("")
    settings = make_settings(f"sqlite:///{tmp_path / 'not-a-folder' / 'ratchet.db'}", redis_url)
    # Then the user's server does not start taking requests: Ratchet's start runs in its lifespan
    with pytest.raises(AssertionError, match="uvicorn exited with 3") as exited:
        serve_users_app(settings, tmp_path / "app.log").stop()
    assert "Application startup failed" in str(exited.value)
