"""Every producer passes a user id and a session state with the same meaning, and reads them
back the same way: Python (`Agent.run`, `Client`), the command line (`ratchet run`, `ratchet
show`, `ratchet session`), the HTTP API (`POST /runs`, `GET /runs/{id}`, `GET /sessions/{id}`)
and the `ratchet.start_run` task. Steps run inline (`in_memory`); the task publishes to Redis."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from orchestrator import Agent, Client, InvalidInputError, RunStatus, ToolContext
from orchestrator.settings import Settings
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.conftest import make_settings, settings_env
from workers.api.routes import create_app
from workers.celery.app import START_TASK
from workers.celery.app import create_app as create_celery_app
from workers.cli.commands import main

Start = Callable[..., dict[str, Any]]


def add_item(item: str, ctx: ToolContext) -> str:
    """Add an item to the cart."""
    ctx.session_state.setdefault("cart", []).append(item)
    return "added"


@pytest.fixture
def inline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryDispatcher]:
    """Steps inline on a SQLite file; the command line's `Client()` reads the same settings."""
    with in_memory(tmp_path / "runs.db") as dispatcher:
        for key, value in settings_env(dispatcher.settings).items():
            monkeypatch.setenv(key, value)
        yield dispatcher


@pytest.fixture
def agent(inline: InMemoryDispatcher) -> str:
    name = f"cart-{uuid.uuid4().hex[:6]}"
    script = ScriptConfig(batches=[[{"tool": "add_item", "arguments": {"item": "milk"}}]], final_text="ok")
    Agent(name=name, model=ScriptedModel(script=script), tools=[add_item], session_state={"currency": "EUR"})
    return name


def by_python(inline: InMemoryDispatcher, agent: str, session: str, capsys: pytest.CaptureFixture[str]) -> Start:
    def start(**given: Any) -> dict[str, Any]:
        out = inline.client.start(agent, input="add milk", session_id=session, **given).wait(5)
        found = inline.client.get_session(session, user_id="ada")
        assert found is not None
        return {"run": [out.user_id, out.session_state], "session": [found.user_id, found.session_state]}

    return start


def by_cli(inline: InMemoryDispatcher, agent: str, session: str, capsys: pytest.CaptureFixture[str]) -> Start:
    def start(user_id: str, session_state: dict[str, Any]) -> dict[str, Any]:
        argv = ["run", agent, "add milk", "--session", session, "--user-id", user_id]
        assert main([*argv, "--session-state", json.dumps(session_state), "--wait", "--timeout", "5"]) == 0
        shown = capsys.readouterr().out
        run_id = shown.splitlines()[0]
        assert f"session={session}  user={user_id}" in shown and "session state: {" in shown
        assert main(["show", run_id, "--json"]) == 0
        run = json.loads(capsys.readouterr().out)
        assert main(["session", session, "--user-id", user_id, "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert [r["run_id"] for r in found["runs"]] == [run_id]
        return {"run": [run["user_id"], run["session_state"]], "session": [found["user_id"], found["session_state"]]}

    return start


def by_http(inline: InMemoryDispatcher, agent: str, session: str, capsys: pytest.CaptureFixture[str]) -> Start:
    def start(**given: Any) -> dict[str, Any]:
        with TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost") as http:
            started = http.post("/runs", json={"agent": agent, "input": "add milk", "session_id": session, **given})
            assert started.status_code == 202, started.text
            run = http.get(f"/runs/{started.json()['run_id']}").json()
            found = http.get(f"/sessions/{session}", params={"user_id": "ada"}).json()
            assert found == http.get(f"/sessions/{session}/runs", params={"user_id": "ada"}).json()
        assert run["status"] == RunStatus.COMPLETED
        return {"run": [run["user_id"], run["session_state"]], "session": [found["user_id"], found["session_state"]]}

    return start


@pytest.mark.parametrize("producer", [by_python, by_cli, by_http])
def test_every_producer_passes_and_reads_back_the_user_and_the_session_state_alike(
    producer: Callable[..., Start], inline: InMemoryDispatcher, agent: str, capsys: pytest.CaptureFixture[str]
) -> None:
    session = f"s-{uuid.uuid4().hex[:6]}"
    start = producer(inline, agent, session, capsys)

    seen = start(user_id="ada", session_state={"cart": ["tea"], "currency": "GBP"})

    # The run's state was merged over the session's, the default added what it lacked, the tool
    # appended to the cart; the run and its session carry the user.
    expected = {"cart": ["tea", "milk"], "currency": "GBP"}
    assert seen == {"run": ["ada", expected], "session": ["ada", expected]}


def test_every_producer_refuses_a_session_state_that_is_not_a_json_object(
    inline: InMemoryDispatcher, agent: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InvalidInputError, match="session_state must be a dict \\(a JSON object\\), not list"):
        inline.client.start(agent, input="x", session_state=["tea"])  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="user_id is 129 characters long; the limit is 128"):
        inline.client.start(agent, input="x", user_id="u" * 129)

    assert main(["run", agent, "x", "--session-state", '["tea"]']) == 2
    assert "ratchet: error: session_state must be a dict (a JSON object), not list" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        main(["run", agent, "x", "--session-state", "{not json"])
    assert usage.value.code == 2
    assert "argument --session-state: not JSON" in capsys.readouterr().err

    with TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost") as http:
        refused = http.post("/runs", json={"agent": agent, "input": "x", "session_state": ["tea"]})
        too_long = http.post("/runs", json={"agent": agent, "input": "x", "user_id": "u" * 129})
    assert refused.status_code == too_long.status_code == 422
    assert "user_id is 129 characters long" in too_long.json()["error"]["message"]


def test_the_start_run_task_passes_the_user_and_the_session_state(redis_url: str, tmp_path: Path) -> None:
    settings: Settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    app = create_celery_app(settings)
    try:
        run_id = (
            app.tasks[START_TASK]
            .apply(
                args=["by-task", "hello"], kwargs={"session_id": "s-task", "user_id": "ada", "session_state": {"n": 1}}
            )
            # An in-process worker earlier in the session leaves Celery thinking it is inside a
            # task; this eager call blocks on nothing.
            .get(disable_sync_subtasks=False)
        )
        run = Client(settings).get_run(run_id)
    finally:
        app.close()
    assert (run.user_id, run.session_state, run.status) == ("ada", {"n": 1}, RunStatus.QUEUED)
