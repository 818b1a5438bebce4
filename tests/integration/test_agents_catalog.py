"""The agent catalog through the store, the HTTP API (`GET /agents`, `GET /agents/{name}`) and
`ratchet agents`, on SQLite and PostgreSQL: what a worker wrote, live or not and when last seen,
every definition of a name, a 404 for a name no worker served, and two workers of one version
writing at once (one row). Workers writing it at boot: test_routing_workers.py and test_ui.py."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
from fastapi import FastAPI

from orchestrator import Agent, Client, tool
from orchestrator import agent as agent_module
from orchestrator.catalog import describe, live_seconds, write_served
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.database import open_engine
from orchestrator.testing.scripted_model import ScriptedModel
from tests.conftest import settings_env
from tests.integration.test_api import error_of
from tests.integration.test_api_records import call
from workers.api.agents import AgentDetail, AgentList, AgentVersion
from workers.api.routes import create_app
from workers.cli.commands import main


@tool(at_most_once=True)
def send_mail(to: str, body: str) -> str:
    """Send a mail."""
    return f"sent to {to}"


def defined(prefix: str, **kwargs: object) -> Agent:
    """An agent of a fresh name, then forgotten by this process: what a worker served."""
    agent = Agent(name=f"{prefix}-{uuid.uuid4().hex[:6]}", model=ScriptedModel(id="m1"), **kwargs)  # type: ignore[arg-type]
    agent_module._registry.pop(agent.name, None)
    agent_module._sites.pop(agent.name, None)
    return agent


def store_at(settings: Settings, seconds_ago: float) -> Store:
    """A store whose clock is `seconds_ago` behind: what it writes was written then."""
    return Store(open_engine(settings.database_url), clock=lambda: time.time() - seconds_ago)


@pytest.fixture
def store(settings: Settings) -> Store:
    return Store.open(settings.database_url)


@pytest.fixture
def app(settings: Settings, store: Store) -> FastAPI:
    return create_app(settings, client=Client(settings, store=store))


def test_the_api_lists_what_workers_serve_and_says_which_no_live_worker_serves_and_when_it_was_seen(
    app: FastAPI, store: Store, settings: Settings
) -> None:
    mailer = defined("mailer", tools=[send_mail], queue="mail")
    write_served(store, [mailer])
    old = store_at(settings, 2 * live_seconds(settings))
    stale = defined("stale")
    try:
        write_served(old, [stale])
        seen = old.clock()
    finally:
        old.dispose()

    listed = call(app, "GET", "/agents")
    assert listed.status_code == 200, listed.text
    agents = {a["name"]: a for a in listed.json()["agents"]}
    assert agents[mailer.name]["live"] is True
    assert agents[mailer.name]["latest"]["definition_hash"] == describe(mailer).hash
    assert agents[stale.name]["live"] is False
    assert agents[stale.name]["last_seen"] == pytest.approx(seen, abs=1)

    one = call(app, "GET", f"/agents/{mailer.name}")
    assert one.status_code == 200, one.text
    [version] = one.json()["definitions"]
    assert version["model"] == {"provider": None, "id": "m1"}
    assert version["queue"] == "mail" and version["kind"] == "agent"
    assert [(t["name"], t["flags"]) for t in version["tools"]] == [("send_mail", {"at_most_once": True})]
    assert sorted(version["tools"][0]["parameters"]["properties"]) == ["body", "to"]

    error_of(call(app, "GET", "/agents/no-such-agent"), 404, "AgentNotFoundError")


def test_two_workers_of_one_version_writing_at_once_leave_one_row_and_another_version_a_second(
    store: Store,
) -> None:
    agent = defined("raced")
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def boot() -> None:
        barrier.wait()
        try:
            write_served(store, [agent])
        except BaseException as exc:  # asserted below
            errors.append(exc)

    threads = [threading.Thread(target=boot) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert errors == []
    assert [r.definition_hash for r in store.catalog.read(agent.name)] == [describe(agent).hash]
    newer = Agent(name=agent.name, model=ScriptedModel(id="m2"))
    agent_module._registry.pop(agent.name, None)
    agent_module._sites.pop(agent.name, None)
    write_served(store, [newer])
    assert [r.definition_hash for r in store.catalog.read(agent.name)] == [describe(newer).hash, describe(agent).hash]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the command's part: the store's is above
def test_ratchet_agents_lists_the_catalog_and_shows_one_agent_with_its_tools(
    store: Store,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    mailer = defined("mailer", tools=[send_mail])
    write_served(store, [mailer])
    old = store_at(settings, 3 * 86400)
    stale = defined("stale")
    try:
        write_served(old, [stale])
    finally:
        old.dispose()

    assert main(["agents"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert f"agent  live  {describe(mailer).hash[:12]}  ?/m1" in lines[mailer.name]
    assert "not live: last seen" in lines[stale.name] and "(3d ago)" in lines[stale.name]

    assert main(["agents", mailer.name]) == 0
    shown = capsys.readouterr().out
    assert describe(mailer).hash in shown and "tool send_mail(body, to) [at_most_once=True]" in shown

    assert main(["agents", mailer.name, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["live"] is True and answer["definitions"][0]["definition_hash"] == describe(mailer).hash

    assert set(answer) == set(AgentDetail.model_fields)  # GET /agents/{agent}'s shape
    assert set(answer["definitions"][0]) == set(AgentVersion.model_fields)

    assert main(["agents", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert set(listed) == set(AgentList.model_fields)  # GET /agents' shape
    assert {a["name"] for a in listed["agents"]} >= {mailer.name, stale.name}

    assert main(["agents", "no-such-agent"]) == 1
    assert "no worker has served an agent or team named 'no-such-agent'" in capsys.readouterr().err
