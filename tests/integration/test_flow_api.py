"""Flow control over the HTTP API, in process over ASGI on the in-memory dispatcher: a producer
drives a run's concurrency key through `user_id` (POST /runs), reads why a run waits in its log
(GET /runs/{id}/log), and a cancel (POST /runs/{id}/cancel) gives its place to the run waiting."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from orchestrator import Agent
from orchestrator.testing.script import ScriptConfig
from tests.flow_support import limited, lookup, name, run_step_of
from tests.support import CountingModel
from workers.api.routes import create_app


def test_over_http_a_users_second_run_waits_with_its_reason_in_its_log_until_the_first_is_cancelled(
    tmp_path: Path,
) -> None:
    agent = Agent(name=name("http"), model=CountingModel(script=ScriptConfig(tool_batches=1)), tools=[lookup])
    with limited(tmp_path, max_runs_per_key=1) as inline:
        http = TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost")

        def call(method: str, path: str, **kwargs: Any) -> Any:
            response = http.request(method, path, **kwargs)
            assert response.status_code < 300, response.text
            return response.json()

        first = call("POST", "/runs", json={"agent": agent.name, "input": "a", "user_id": "u"})["run_id"]
        run_step_of(inline, first)
        second = call("POST", "/runs", json={"agent": agent.name, "input": "b", "user_id": "u"})["run_id"]
        run_step_of(inline, second)
        log = call("GET", f"/runs/{second}/log")["entries"]
        assert [(e["kind"], e["detail"]["reason"]) for e in log] == [("throttled", "concurrency")]
        assert call("GET", f"/runs/{second}")["status"] == "QUEUED"
        call("POST", f"/runs/{first}/cancel", json={})
        inline.run_until_idle()
        assert call("GET", f"/runs/{second}")["status"] == "COMPLETED"
