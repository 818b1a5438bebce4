"""A person in the loop over HTTP (`workers/api/decisions.py`, the continue's `requirements`), called
in process over ASGI on SQLite and PostgreSQL, with real steps run inline (`in_memory`): a run
paused by its tool step is listed by status and in `GET /approvals`, carries its requirements,
is decided one requirement at a time or by a continue, and each refusal is the store's error at
its status, the first decider named in a 409, a decision on a tool a deploy changed a 409 too.
The run page deciding over a real server and worker: tests/integration/test_ui.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI

from orchestrator import Agent, Client, RunStatus, Tool, tool
from orchestrator.catalog import describe, write_served
from orchestrator.settings import Settings
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.deploy_support import retired
from tests.integration.test_api import JSON, error_of
from tests.integration.test_api_records import call
from workers.api.routes import create_app

S = RunStatus
paid: list[tuple[int, str]] = []


@tool(requires_confirmation=True)
def pay(amount: int, to: str) -> str:
    """Pay someone."""
    paid.append((amount, to))
    return f"paid {amount} to {to}"


@tool(requires_user_input=True, user_input_fields=["recipient"])
def send_mail(subject: str, recipient: str) -> str:
    """Send a mail."""
    return f"sent {subject} to {recipient}"


@tool(external_execution=True)
def deploy(service: str) -> str:
    """Deploy a service (the caller runs it)."""
    raise AssertionError("an external call is never run here")


def payer(*calls: tuple[int, str], pause_timeout: float | None = None) -> Agent:
    batch = [{"tool": "pay", "arguments": {"amount": amount, "to": to}} for amount, to in calls]
    script = ScriptConfig(batches=[batch], final_text="Done: {tool_results}")
    return Agent(
        name=f"api-hitl-{uuid.uuid4().hex[:6]}",
        model=ScriptedModel(script=script),
        tools=[pay],
        pause_timeout=pause_timeout,
    )


@pytest.fixture
def inline(settings: Settings) -> Iterator[InMemoryDispatcher]:
    with in_memory(settings) as dispatcher:  # real steps, run in this process on the test's database
        paid.clear()
        yield dispatcher


@pytest.fixture
def app(settings: Settings, inline: InMemoryDispatcher) -> FastAPI:
    return create_app(settings, client=inline.client)


def paused(client: Client, agent: Agent, user_id: str | None = None) -> str:
    run_id = client.start(agent.name, input="pay them", user_id=user_id).run_id
    assert client.get_run(run_id).status == S.PAUSED
    return run_id


def test_a_paused_run_is_listed_carries_its_requirements_and_is_decided_one_at_a_time(
    app: FastAPI, inline: InMemoryDispatcher
) -> None:
    agent = payer((120, "ann"), (75, "bob"))
    run_id = paused(inline.client, agent)
    done = inline.client.start(payer().name, input="nothing to pay").run_id

    listed = call(app, "GET", "/runs", params={"status": "PAUSED"}).json()["runs"]
    assert [r["run_id"] for r in listed] == [run_id] and done not in {r["run_id"] for r in listed}
    run = call(app, "GET", f"/runs/{run_id}").json()
    assert run["is_paused"] is True and run["active_requirements"] == run["requirements"]
    # One batch's requirements share their created_at: taken by the call, not by their order
    first, second = sorted(run["requirements"], key=lambda r: -r["tool_execution"]["tool_args"]["amount"])
    assert first["pause_type"] == "confirmation" and first["status"] == "pending" and first["decision"] is None
    assert first["tool_execution"]["tool_name"] == "pay"
    assert first["tool_execution"]["tool_args"] == {"amount": 120, "to": "ann"}

    path = f"/runs/{run_id}/requirements/{first['id']}"
    decided = call(app, "POST", path, json={"kind": "confirm", "by": "ann"})
    assert decided.status_code == 200, decided.text
    stored = decided.json()
    assert (stored["id"], stored["status"], stored["decided_by"]) == (first["id"], "decided", "ann")
    assert stored["decision"]["kind"] == "confirm" and stored["decided_at"] is not None
    assert call(app, "GET", f"/runs/{run_id}").json()["status"] == "PAUSED" and paid == []  # one still pending
    # The same decision again answers it as stored; another one names who decided first
    assert call(app, "POST", path, json={"kind": "confirm", "by": "ann"}).json() == stored
    refused = error_of(call(app, "POST", path, json={"kind": "reject", "by": "bob"}), 409, "DecisionConflictError")
    assert (refused["decided_by"], refused["decided_at"]) == ("ann", stored["decided_at"])
    assert "by ann" in refused["message"]

    second_path = f"/runs/{run_id}/requirements/{second['id']}"
    rejected = call(app, "POST", second_path, json={"kind": "reject", "note": "not this month", "by": "bob"})
    assert rejected.status_code == 200, rejected.text

    run = call(app, "GET", f"/runs/{run_id}").json()  # the last decision resumed it, same run_id
    assert run["status"] == "COMPLETED" and run["is_paused"] is False and run["active_requirements"] == []
    assert sorted((r["decision"]["kind"], r["decision"]["note"], r["decided_by"]) for r in run["requirements"]) == [
        ("confirm", None, "ann"),
        ("reject", "not this month", "bob"),
    ]
    assert paid == [(120, "ann")]
    assert sorted(m["content"] for m in run["messages"] if m["role"] == "tool") == ["not this month", "paid 120 to ann"]
    assert call(app, "GET", "/runs", params={"status": "PAUSED"}).json()["runs"] == []


def test_each_refusal_is_the_stores_error_at_its_status(app: FastAPI, inline: InMemoryDispatcher) -> None:
    run_id = paused(inline.client, payer((5, "ann")))
    other = paused(inline.client, payer((6, "bob")))
    [req] = inline.client.get_run(run_id).requirements
    path = f"/runs/{run_id}/requirements/{req.id}"

    error_of(
        call(app, "POST", f"/runs/{run_id}/requirements/nope", json={"kind": "confirm"}),
        404,
        "RequirementNotFoundError",
    )
    # Another run's requirement is not reached through this one, nor one of a run that is not there
    error_of(
        call(app, "POST", f"/runs/{other}/requirements/{req.id}", json={"kind": "confirm"}),
        404,
        "RequirementNotFoundError",
    )
    error_of(
        call(app, "POST", f"/runs/no-such-run/requirements/{req.id}", json={"kind": "confirm"}),
        404,
        "RequirementNotFoundError",
    )
    kind = error_of(call(app, "POST", path, json={"kind": "input", "values": {"to": "x"}}), 422, "DecisionKindError")
    assert "send confirm or reject" in kind["message"]
    error_of(call(app, "POST", path, json={"kind": "approve"}), 422, "RequestValidationError")
    error_of(call(app, "POST", path, json={"kind": "confirm", "by": "a\nb"}), 422, "InvalidInputError")
    error_of(call(app, "POST", path, json={"kind": "confirm", "extra": 1}), 422, "RequestValidationError")
    long = "x" * 100_001
    error_of(call(app, "POST", path, json={"kind": "reject", "note": long}), 422, "DecisionKindError")
    assert inline.client.get_run(run_id).requirements[0].status == "pending"  # nothing was stored

    assert call(app, "POST", f"/runs/{run_id}/cancel", headers=JSON).json()["status"] == "CANCELLED"
    error_of(call(app, "POST", path, json={"kind": "confirm"}), 409, "RunNotPausedError")
    assert paid == []


def test_a_decision_past_the_deadline_is_a_409(
    app: FastAPI, inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = paused(inline.client, payer((5, "ann"), pause_timeout=3600))
    [req] = inline.client.get_run(run_id).requirements
    assert req.deadline_at is not None
    later = req.deadline_at + 1
    monkeypatch.setattr(inline.store, "clock", lambda: later)  # an hour on: no sweeper has acted yet

    expired = call(app, "POST", f"/runs/{run_id}/requirements/{req.id}", json={"kind": "confirm"})
    assert "deadline passed" in error_of(expired, 409, "DecisionExpiredError")["message"]
    assert paid == []


def test_a_continue_carries_decisions_and_stores_them_as_one_by_one(app: FastAPI, inline: InMemoryDispatcher) -> None:
    run_id = paused(inline.client, payer((120, "ann"), (75, "bob")))
    first, second = (r.id for r in inline.client.get_run(run_id).requirements)  # in either order
    cont = f"/runs/{run_id}/continue"

    assert call(app, "POST", cont, headers=JSON).json()["status"] == "PAUSED"  # nothing decided: a no-op
    error_of(call(app, "POST", cont, json={"input": "more"}), 409, "RunBusyError")
    unknown = {
        "requirements": [
            {"id": first, "decision": {"kind": "confirm"}},
            {"id": "nope", "decision": {"kind": "confirm"}},
        ]
    }
    error_of(call(app, "POST", cont, json=unknown), 404, "RequirementNotFoundError")
    assert [r.status for r in inline.client.get_run(run_id).requirements] == ["pending", "pending"]  # none stored
    wrong = {"requirements": [{"id": first, "decision": {"kind": "result", "result": "x"}}]}
    error_of(call(app, "POST", cont, json=wrong), 422, "DecisionKindError")

    one = call(app, "POST", cont, json={"requirements": [{"id": first, "decision": {"kind": "confirm"}}], "by": "ann"})
    assert one.status_code == 202 and one.json()["run_id"] == run_id and one.json()["status"] == "PAUSED"
    both = {
        "requirements": [
            {"id": first, "decision": {"kind": "confirm"}},  # sent again: a no-op
            {"id": second, "decision": {"kind": "reject", "note": "twice is enough"}},
        ],
        "by": "bob",
    }
    resumed = call(app, "POST", cont, json=both)
    assert resumed.status_code == 202, resumed.text
    run = resumed.json()
    assert run["run_id"] == run_id and run["status"] == "COMPLETED"  # the same run, not a fork
    decisions = {r["id"]: (r["decision"]["kind"], r["decided_by"]) for r in run["requirements"]}
    assert decisions == {first: ("confirm", "ann"), second: ("reject", "bob")}
    conflict = {"requirements": [{"id": first, "decision": {"kind": "reject"}}]}
    assert error_of(call(app, "POST", cont, json=conflict), 409, "DecisionConflictError")["decided_by"] == "ann"
    assert len(paid) == 1


def test_approvals_list_what_paused_runs_wait_for_across_runs_with_their_runs(
    app: FastAPI, inline: InMemoryDispatcher
) -> None:
    ann_agent, bob_agent = payer((1, "x"), (2, "y")), payer((3, "z"))
    ann = paused(inline.client, ann_agent, user_id="ann")
    bob = paused(inline.client, bob_agent, user_id="bob")

    def listed(**params: Any) -> list[tuple[str, int]]:
        answered = call(app, "GET", "/approvals", params=params)
        assert answered.status_code == 200, answered.text
        return [
            (a["run_id"], a["requirement"]["tool_execution"]["tool_args"]["amount"])
            for a in answered.json()["approvals"]
        ]

    every = listed()
    assert [run for run, _ in every] == [ann, ann, bob] and sorted(every) == sorted([(ann, 1), (ann, 2), (bob, 3)])
    assert listed(agent=bob_agent.name) == [(bob, 3)]
    assert sorted(listed(user_id="ann")) == [(ann, 1), (ann, 2)]
    assert listed(limit=1) == every[:1]  # oldest first
    [entry] = call(app, "GET", "/approvals", params={"user_id": "bob"}).json()["approvals"]
    assert (entry["agent_name"], entry["user_id"], entry["parent_run_id"]) == (bob_agent.name, "bob", None)
    assert entry["requirement"]["run_id"] == bob and entry["requirement"]["status"] == "pending"
    error_of(call(app, "GET", "/approvals", params={"limit": 0}), 422, "InvalidInputError")
    error_of(call(app, "GET", "/approvals", params={"user_id": "a\tb"}), 422, "InvalidInputError")

    req = entry["requirement"]["id"]
    assert call(app, "POST", f"/runs/{bob}/requirements/{req}", json={"kind": "confirm"}).status_code == 200
    assert sorted(listed()) == [(ann, 1), (ann, 2)]  # decided: no longer waiting


def test_a_persons_fields_and_an_external_result_are_given_over_http(app: FastAPI, inline: InMemoryDispatcher) -> None:
    script = ScriptConfig(
        batches=[
            [
                {"tool": "send_mail", "arguments": {"subject": "notes"}},
                {"tool": "deploy", "arguments": {"service": "api"}},
            ]
        ],
        final_text="Done: {tool_results}",
    )
    agent = Agent(
        name=f"api-hitl-{uuid.uuid4().hex[:6]}", model=ScriptedModel(script=script), tools=[send_mail, deploy]
    )
    run_id = inline.client.start(agent.name, input="ship").run_id
    mail, ship = call(app, "GET", f"/runs/{run_id}").json()["requirements"]
    assert mail["pause_type"] == "user_input" and [f["name"] for f in mail["user_input_schema"]] == ["recipient"]
    assert ship["pause_type"] == "external_execution"

    missing = call(app, "POST", f"/runs/{run_id}/requirements/{mail['id']}", json={"kind": "input", "values": {}})
    assert "missing: ['recipient']" in error_of(missing, 422, "DecisionKindError")["message"]
    answered = call(
        app,
        "POST",
        f"/runs/{run_id}/requirements/{mail['id']}",
        json={"kind": "input", "values": {"recipient": "ann@example.com"}},
    )
    assert answered.json()["user_input_schema"][0]["value"] == "ann@example.com"
    result = {"kind": "result", "result": "deployed by CI, build 42\x00 with a NUL"}
    assert call(app, "POST", f"/runs/{run_id}/requirements/{ship['id']}", json=result).status_code == 200

    run = call(app, "GET", f"/runs/{run_id}").json()
    assert run["status"] == "COMPLETED"
    tools = {m["tool_name"]: m["content"] for m in run["messages"] if m["role"] == "tool"}
    assert tools["send_mail"] == "sent notes to ann@example.com"
    assert tools["deploy"].startswith("deployed by CI, build 42\\x00 with a NUL")  # stored, escaped as a result is


def version(agent_name: str, *tools: Tool) -> Agent:
    """A version of the agent `agent_name` (each defined on this line replaces the one before)."""
    script = ScriptConfig(
        batches=[[{"tool": "pay", "arguments": {"amount": 5, "to": "ann"}}]], final_text="{tool_results}"
    )
    return Agent(name=agent_name, model=ScriptedModel(script=script), tools=list(tools))


def test_a_decision_on_a_tool_a_deploy_changed_is_a_409_that_says_what_changed(
    app: FastAPI, inline: InMemoryDispatcher
) -> None:
    agent_name = f"api-hitl-{uuid.uuid4().hex[:6]}"
    first = version(agent_name, pay)
    run_id = paused(inline.client, first)
    [req] = inline.client.get_run(run_id).requirements
    # The workers of the version that paused stopped, and one of the next version booted: `pay`
    # no longer asks for a confirmation (with the old one live, its step would be handed to it)
    retired(inline.store, describe(first).hash)
    write_served(inline.store, [version(agent_name, pay.with_flags(requires_confirmation=False))])

    refused = call(app, "POST", f"/runs/{run_id}/requirements/{req.id}", json={"kind": "confirm"})

    message = error_of(refused, 409, "PausedToolChangedError")["message"]
    assert "tool 'pay' now runs without asking anyone, where the run paused for a confirmation" in message
    assert "Reject the call instead" in message
    carried = {"requirements": [{"id": req.id, "decision": {"kind": "confirm"}}]}
    error_of(call(app, "POST", f"/runs/{run_id}/continue", json=carried), 409, "PausedToolChangedError")
    assert inline.client.get_run(run_id).requirements[0].status == "pending" and paid == []
    # A rejection is taken
    assert call(app, "POST", f"/runs/{run_id}/requirements/{req.id}", json={"kind": "reject"}).status_code == 200
    assert inline.client.get_run(run_id).status == S.COMPLETED and paid == []
