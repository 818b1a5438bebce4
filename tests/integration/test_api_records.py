"""The HTTP API's listing, log, steps and session delete (`workers/api/records.py`), called in
process over ASGI on SQLite and PostgreSQL: the same filters, pages, errors and refusals as
`Client`; and the run pages' files (`workers/api/ui.py`), served without a token."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from fastapi import FastAPI
from pydantic import TypeAdapter

from orchestrator import Agent, Client, RunStatus
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.testing import in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.timeline import Step
from tests.conftest import make_settings
from tests.integration.stored_runs import rows_of, seed
from tests.integration.test_api import JSON, error_of
from workers.api.routes import create_app

S = RunStatus
STEP = TypeAdapter(Step)
#: A tool batch with a failing call, then a model call refused once (HTTP 400).
FAILING_ONCE = ScriptConfig(
    batches=[[{"tool": "fetch", "arguments": {"url": "u"}}]], faults=[Fault(turn=2, status=400, times=1)]
)


def fetch(url: str) -> str:
    """Fetch a page."""
    raise ConnectionError(f"{url}: refused")


@pytest.fixture
def store(settings: Settings) -> Store:
    return Store.open(settings.database_url)


@pytest.fixture
def app(settings: Settings, store: Store) -> FastAPI:
    return create_app(settings, client=Client(settings, store=store))


def call(app: FastAPI, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to the app, as an HTTP client would send it."""

    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
            return await http.request(method, path, **kwargs)

    return asyncio.run(send())


def test_runs_are_listed_by_page_with_the_clients_filters(app: FastAPI, store: Store) -> None:
    failed = [seed(store, S.ERROR, agent="mailer", user_id="u1") for _ in range(3)]
    cancelled = seed(store, S.CANCELLED, agent="mailer")
    seed(store, S.COMPLETED, agent="mailer")
    team = seed(store, S.COMPLETED, agent="crew", kind="team")
    member = seed(store, S.COMPLETED, agent="mailer", parent=team)

    first = call(app, "GET", "/runs", params={"status": "ERROR", "agent": "mailer", "limit": 2})
    assert first.status_code == 200, first.text
    assert [r["run_id"] for r in first.json()["runs"]] == failed[::-1][:2]
    assert first.json()["runs"][0]["error"] == {"type": "ModelCallError", "message": "it broke"}
    cursor = first.json()["next_cursor"]
    rest = call(app, "GET", "/runs", params={"status": "ERROR", "agent": "mailer", "limit": 2, "cursor": cursor})
    assert [r["run_id"] for r in rest.json()["runs"]] == [failed[0]] and rest.json()["next_cursor"] is None
    # Several statuses: repeated, or separated by commas; members when asked
    both = call(app, "GET", "/runs", params=[("status", "ERROR"), ("status", "cancelled"), ("since", "1h")])
    assert [r["run_id"] for r in both.json()["runs"]] == [cancelled, *failed[::-1]]
    assert len(call(app, "GET", "/runs", params={"status": "ERROR,CANCELLED"}).json()["runs"]) == 4
    members = call(app, "GET", "/runs", params={"agent": "mailer", "status": "COMPLETED", "members": "true"})
    assert member in [r["run_id"] for r in members.json()["runs"]]
    assert [r["run_id"] for r in call(app, "GET", "/runs", params={"user_id": "u1"}).json()["runs"]] == failed[::-1]


def test_a_runs_log_is_read_whole_and_an_unknown_run_is_a_404(app: FastAPI, store: Store) -> None:
    run_id = seed(store, S.ERROR)

    log = call(app, "GET", f"/runs/{run_id}/log")

    assert log.status_code == 200, log.text
    assert log.json()["run_id"] == run_id
    assert [(e["kind"], e["detail"]["to"]) for e in log.json()["entries"]] == [("error", "ERROR")]
    error_of(call(app, "GET", "/runs/no-such-run/log"), 404, "RunNotFoundError")


def test_deleting_a_session_answers_what_went_and_refuses_a_live_run_by_name(app: FastAPI, store: Store) -> None:
    done = [seed(store, S.COMPLETED, session_id="s-done") for _ in range(2)]
    going = seed(store, S.QUEUED, session_id="s-busy")

    deleted = call(app, "DELETE", "/sessions/s-done", headers=JSON)
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"session_id": "s-done", "runs": 2} and rows_of(store, done)["runs"] == 0

    error_of(call(app, "DELETE", "/sessions/s-done", headers=JSON), 404, "SessionNotFound")
    refused = error_of(call(app, "DELETE", "/sessions/s-busy", headers=JSON), 409, "RunLiveError")
    assert refused["run_id"] == going and f"ratchet cancel {going}" in refused["message"]
    assert rows_of(store, [going])["runs"] == 1


def test_a_listing_the_api_cannot_take_is_a_422_saying_why(redis_url: str, tmp_path: Path) -> None:
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)  # the same on either database
    app = create_app(settings)
    for params, says in [
        ({"status": "DONE"}, "is not a run status"),
        ({"limit": 5000}, "from 1 to 1000"),
        ({"limit": "many"}, "limit"),
        ({"cursor": "not-a-cursor"}, "not one a listing returned"),
        ({"since": "someday"}, "is not a time"),
        ({"agent": "a\x07"}, "control character"),
    ]:
        response = call(app, "GET", "/runs", params=params)
        assert response.status_code == 422, (params, response.text)
        assert says in response.json()["error"]["message"], params


def test_a_runs_steps_are_the_clients_over_http_as_they_ran_on_each_database(settings: Settings, store: Store) -> None:
    with in_memory(settings) as inline:  # real steps, run in this process on the test's database
        agent = Agent(name=f"records-{uuid.uuid4().hex[:6]}", model=ScriptedModel(script=FAILING_ONCE), tools=[fetch])
        failed = Client(settings, store=store, dispatcher=inline).start(agent.name, input="go").run_id
        app = create_app(settings, client=Client(settings, store=store, dispatcher=inline))
        assert store.get_record(failed).status == S.ERROR
        running = seed(store, S.QUEUED)
        assert store.claim(running, 0, "model", owner="host-b:77:task-3", lease_seconds=30, max_attempts=5) is not None

        answered = call(app, "GET", f"/runs/{failed}/steps")
        on_http = [(s["task"], s["status"], s["tool_errors"]) for s in answered.json()["steps"]]
        assert on_http == [("model", "done", 0), ("tools", "done", 1), ("model", "failed", 0)]
        assert answered.json()["steps"][2]["error"]["type"] == "BadRequestError"
        assert answered.json()["steps"] == [
            STEP.dump_python(s, mode="json") for s in Client(settings).get_steps(failed)
        ]
        (now,) = call(app, "GET", f"/runs/{running}/steps").json()["steps"]
        assert (now["status"], now["worker"], now["task_id"]) == ("running", "host-b:77", "task-3")

        assert call(app, "POST", f"/runs/{failed}/continue", headers=JSON).status_code == 202
        after = call(app, "GET", f"/runs/{failed}/steps").json()["steps"]
        assert [s["status"] for s in after] == ["done", "done", "failed", "done"]
    error_of(call(app, "GET", "/runs/no-such-run/steps"), 404, "RunNotFoundError")


def test_the_page_is_served_without_a_token_and_every_api_route_still_needs_one(redis_url: str, tmp_path: Path) -> None:
    token = "page-token"
    app = create_app(make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url, api_tokens=token))

    to_page = call(app, "GET", "/")
    assert to_page.status_code == 307 and to_page.headers["location"] == "ui/"
    served = call(app, "GET", "/ui/")
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in served.headers["content-security-policy"]
    # Every script and style sheet the page names is served beside it, as what it is
    named = re.findall(r'(?:src|href)="([\w.]+\.(js|css))"', served.text)
    assert {"app.js", "decide.js", "playground.js", "timeaxis.js", "app.css", "console.css"} <= {n for n, _ in named}
    for name, kind in named:
        answered = call(app, "GET", f"/ui/{name}")
        assert answered.status_code == 200, name
        assert answered.headers["content-type"].startswith({"js": "text/javascript", "css": "text/css"}[kind]), name
    # The API's routes, and a file that is not one of the page's
    for path in ("/runs", "/runs/x/steps", "/runs/x/events", "/approvals", "/schedules", "/ui/nothing.js"):
        assert call(app, "GET", path).status_code == 401, path
    assert call(app, "GET", "/ui/nothing.js", headers={"Authorization": f"Bearer {token}"}).status_code == 404
