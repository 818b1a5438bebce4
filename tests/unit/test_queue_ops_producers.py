"""`run_timeout` and the bounds on QUEUED runs from each producer but Python's
(tests/unit/test_run_deadlines_inline.py, tests/unit/test_queue_bounds_inline.py): the HTTP API's
start and continue bodies, its 429 with Retry-After, and `ratchet run` / `continue` with
--run-timeout and exit status 75 when the queue is full, on the in-memory dispatcher's SQLite
store."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx2 as httpx
import pytest

from orchestrator import Agent, RunStatus
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import CountingModel
from workers.api.routes import create_app
from workers.cli.commands import main

S = RunStatus


def name() -> str:
    return f"queue-ops-{uuid.uuid4().hex[:8]}"


def call(inline: InMemoryDispatcher, method: str, path: str, **kwargs: Any) -> httpx.Response:
    app = create_app(inline.settings, client=inline.client)

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            return await http.request(method, path, **kwargs)

    return asyncio.run(send())


def test_the_api_starts_a_run_with_a_deadline_and_refuses_one_past_max_queued_with_429(
    inline: InMemoryDispatcher,
) -> None:
    inline.autorun = False
    agent = Agent(name=name(), model=CountingModel(), max_queued=2)
    started = call(inline, "POST", "/runs", json={"agent": agent.name, "input": "hi", "run_timeout": 90})
    assert started.status_code == 202, started.text
    run = started.json()
    assert run["run_timeout"] == 90 and run["deadline_at"] == pytest.approx(run["created_at"] + 90)
    assert call(inline, "POST", "/runs", json={"agent": agent.name, "input": "hi"}).status_code == 202

    full = call(inline, "POST", "/runs", json={"agent": agent.name, "input": "hi"})

    assert full.status_code == 429 and full.headers["Retry-After"] == "5"
    error = full.json()["error"]
    assert error["type"] == "QueueFullError" and "max_queued=2" in error["message"]
    assert len(inline.client.list_runs(agent=agent.name).runs) == 2  # nothing written
    for bad in (0, -5, "90", True, 400 * 86400):
        refused = call(inline, "POST", "/runs", json={"agent": agent.name, "input": "hi", "run_timeout": bad})
        assert refused.status_code == 422 and "run_timeout" in refused.text


def test_the_api_continues_a_run_with_a_new_deadline(inline: InMemoryDispatcher) -> None:
    agent = Agent(name=name(), model=CountingModel(script=ScriptConfig(faults=[Fault(status=400)])))
    failed = agent.run("hi")
    assert failed.status == S.ERROR and failed.deadline_at is None

    inline.autorun = False
    body = {"run_timeout": 120}
    resumed = call(inline, "POST", f"/runs/{failed.run_id}/continue", json=body)

    assert resumed.status_code == 202, resumed.text
    assert resumed.json()["status"] == "QUEUED" and resumed.json()["run_timeout"] == 120
    again = call(inline, "POST", f"/runs/{failed.run_id}/continue", json=body)  # QUEUED: going on as it is
    assert again.status_code == 409 and again.json()["error"]["type"] == "RunBusyError"


def test_ratchet_run_and_continue_take_a_run_timeout_and_a_full_queue_exits_75(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RATCHET_DATABASE_URL", inline.settings.database_url)
    monkeypatch.setenv("RATCHET_DISPATCHER", "orchestrator.testing:InMemoryDispatcher")
    agent = Agent(name=name(), model=CountingModel(), max_queued=1)

    assert main(["run", agent.name, "hello", "--run-timeout", "30m", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_timeout"] == 1800 and out["deadline_at"] == pytest.approx(out["created_at"] + 1800)
    assert main(["continue", out["run_id"], "--input", "more", "--run-timeout", "2h", "--json"]) == 0
    forked = json.loads(capsys.readouterr().out)  # COMPLETED: a fork, with the new deadline
    assert forked["forked_from"] == out["run_id"] and forked["run_timeout"] == 7200
    assert main(["show", out["run_id"]]) == 0 and "run_timeout 1800s" in capsys.readouterr().out

    inline.autorun = False
    agent.start("waits")  # QUEUED: the agent's one place is taken
    assert main(["run", agent.name, "hello"]) == 75
    assert "QueueFullError" not in (err := capsys.readouterr().err) and "max_queued=1" in err
    assert main(["run", agent.name, "hello", "--json"]) == 75
    assert json.loads(capsys.readouterr().err)["error"]["type"] == "QueueFullError"
    assert main(["run", agent.name, "hello", "--run-timeout", "0"]) == 2
    assert "run_timeout" in capsys.readouterr().err
