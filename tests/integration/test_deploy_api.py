"""A deploy over the HTTP API, in process over ASGI on the in-memory dispatcher: a run stopped
with DefinitionChangedError (a deploy changed the argument schema of the tool it owes a call
of) continued with `accept_definition` (POST /runs/{id}/continue), a hash no worker served
refused with 422, and each step's definition in GET /runs/{id}/steps. The same rules stepped
inline: tests/unit/test_deploys.py; on worker processes: tests/integration/test_deploy_workers.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from orchestrator import Agent
from orchestrator.catalog import describe
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import ScriptConfig
from tests.deploy_support import first_tool_takes, gone, older, on, served_once
from tests.support import Clock, CountingModel
from workers.api.routes import create_app


@pytest.fixture
def inline(tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryDispatcher]:
    with in_memory(tmp_path / "runs.db", autorun=False) as dispatcher:
        monkeypatch.setattr(dispatcher.store, "clock", clock)
        yield dispatcher


def test_over_http_a_run_a_deploy_stopped_goes_on_once_a_continue_accepts_the_new_definition(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    looked: list[str] = []

    def lookup(query: str) -> str:
        """Look something up."""
        looked.append(query)
        return f"found {query}"

    script = ScriptConfig(batches=[[{"tool": "lookup", "arguments": {"query": "otters"}}]], final_text="{tool_results}")
    agent = Agent(name=f"deploy-http-{uuid.uuid4().hex[:6]}", model=CountingModel(script=script), tools=[lookup])
    http = TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost")

    def call(method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        response = http.request(method, path, **kwargs)
        assert response.status_code == status, response.text
        return response.json()

    run_id = call("POST", "/runs", 202, json={"agent": agent.name, "input": "find otters"})["run_id"]
    inline.run_next()  # the model's call of `lookup`
    old = older(agent, first_tool_takes({"type": "object", "properties": {}}))
    served_once(inline, old)
    on(inline, run_id, old)
    gone(inline, clock)
    inline.run_until_idle()
    stopped = call("GET", f"/runs/{run_id}")
    assert stopped["status"] == "ERROR" and stopped["error"]["type"] == "DefinitionChangedError"
    new = describe(agent).hash

    refused = call("POST", f"/runs/{run_id}/continue", 422, json={"accept_definition": "f" * 64})
    assert refused["error"]["type"] == "InvalidInputError" and "no worker ever served" in refused["detail"]
    call("POST", f"/runs/{run_id}/continue", 422, json={"accept_definition": "not a hash"})
    assert call("GET", f"/runs/{run_id}")["status"] == "ERROR"
    call("POST", f"/runs/{run_id}/continue", 202, json={"accept_definition": new})
    inline.run_until_idle()

    done = call("GET", f"/runs/{run_id}")
    assert done["status"] == "COMPLETED" and done["definition_hash"] == new and looked == ["otters"]
    steps = call("GET", f"/runs/{run_id}/steps")["steps"]
    assert [(s["task"], s["status"], s["definition_hash"]) for s in steps] == [
        ("model", "done", new),
        ("tools", "failed", new),
        ("tools", "done", new),
        ("model", "done", new),
    ]
