"""`--json` on `ratchet run`, `continue`, `cancel` and `show`: the run as the HTTP API answers it
for the same thing, read back from the API over the same SQLite file; and an error, as the API's
error body. No worker: each run is moved through the store as a step would move it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from orchestrator import Agent, Client
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from tests.conftest import settings_env
from tests.integration.producing import complete, fail
from workers.api.routes import create_app
from workers.cli.commands import main

#: What a POST without a body must say it sends to an API without tokens (`workers.api.loopback`).
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    home = tmp_path / ".ratchet"
    settings = Settings(database_url=f"sqlite:///{home / 'ratchet.db'}", broker_folder=str(home / "broker"))
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    return settings


@pytest.fixture
def api(settings: Settings) -> TestClient:
    return TestClient(create_app(settings, client=Client(settings)), base_url="http://127.0.0.1")


@pytest.fixture
def agent() -> str:
    return Agent(name=f"cli-json-{uuid.uuid4().hex[:6]}", model=OpenAIChat(id="gpt-4o-mini")).name


def printed(capsys: pytest.CaptureFixture[str]) -> object:
    """What the command printed on stdout, as JSON (nothing on stderr)."""
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


def test_run_continue_cancel_and_show_print_the_run_as_the_api_answers_it(
    agent: str, settings: Settings, api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Client(settings).store
    argv = ["run", agent, "hello", "--user-id", "u-1", "--session-state", '{"cart": ["tea"]}', "--priority", "3"]
    assert main([*argv, "--json"]) == 0
    started = printed(capsys)
    assert isinstance(started, dict) and started["status"] == "QUEUED"
    run_id = started["run_id"]
    assert started == api.get(f"/runs/{run_id}").json()

    fail(store, run_id)
    assert main(["show", run_id, "--json"]) == 1  # a run in ERROR
    assert printed(capsys) == api.get(f"/runs/{run_id}").json()

    assert main(["continue", run_id, "--input", "again", "--json"]) == 0  # ERROR resumes in place
    continued = printed(capsys)
    assert continued == api.get(f"/runs/{run_id}").json()
    assert isinstance(continued, dict) and continued["status"] == "QUEUED"

    assert main(["cancel", run_id, "--json"]) == 0
    cancelled = printed(capsys)
    assert cancelled == api.post(f"/runs/{run_id}/cancel", headers=JSON).json()  # a no-op by now: the run as it is
    assert isinstance(cancelled, dict) and cancelled["status"] == "CANCELLED"


def test_run_and_continue_with_wait_print_the_run_once_it_stopped_as_wait_answers_it(
    agent: str, settings: Settings, api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    client = Client(settings)
    run_id = client.start(agent, input="hello", run_id=f"job-{uuid.uuid4().hex[:6]}").run_id
    complete(client.store, run_id, "hi there")

    assert main(["run", agent, "hello", "--run-id", run_id, "--wait", "--json"]) == 0  # the same start: that run
    assert printed(capsys) == api.get(f"/runs/{run_id}/wait").json()

    assert main(["continue", run_id, "--input", "more", "--json"]) == 0  # a COMPLETED run forks
    fork = printed(capsys)
    assert isinstance(fork, dict) and fork["forked_from"] == run_id
    complete(client.store, fork["run_id"], "more here")
    assert main(["continue", run_id, "--input", "more", "--wait", "--json"]) == 0  # the same fork, stopped
    assert printed(capsys) == api.get(f"/runs/{fork['run_id']}/wait").json()


def test_an_error_under_json_is_the_api_error_body_on_stderr(
    settings: Settings, api: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["show", "nope", "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and json.loads(err) == api.get("/runs/nope").json()

    assert main(["cancel", "r" * 65, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and json.loads(err)["error"]["type"] == "InvalidInputError"

    # The API says it from its own modules, the command line from its modules and the catalog: one type
    assert main(["run", "no-such-agent", "hello", "--json"]) == 1
    said = json.loads(capsys.readouterr().err)["error"]
    refused = api.post("/runs", json={"agent": "no-such-agent", "input": "hello"})
    assert refused.status_code == 404 and said["type"] == refused.json()["error"]["type"] == "AgentNotFoundError"
