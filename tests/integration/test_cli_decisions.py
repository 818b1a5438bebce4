"""`ratchet pending`, `approve`, `reject` and `answer`, called as a user would (`main`, in this
process, on the environment's settings) while a real worker runs the steps: a run paused by its
tool step is listed, decided one requirement at a time, and resumes by itself to COMPLETED, on
SQLite and PostgreSQL; `--json` prints what the HTTP API answers; each refusal is the store's
error, exit 1 (2 for a decision that does not answer what is asked, or arguments that cannot be
taken; 1 again for a decision on a tool a deploy changed, which is no mistake of the decider's)."""

from __future__ import annotations

import getpass
import json
import uuid

import pytest
from fastapi.testclient import TestClient

from orchestrator import Agent, Client, RunStatus, Tool, tool
from orchestrator.catalog import write_served
from orchestrator.settings import Settings
from orchestrator.testing import in_memory
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.conftest import settings_env
from workers.api.routes import create_app
from workers.cli.commands import main

S = RunStatus


@tool(requires_confirmation=True)
def pay(amount: int, to: str) -> str:
    """Pay someone."""
    return f"paid {amount} to {to}"


@tool(requires_user_input=True, user_input_fields=["recipient", "copies"])
def send_mail(subject: str, recipient: str, copies: int) -> str:
    """Send a mail."""
    return f"sent {subject} to {recipient} x{copies + 0}"  # a number, or the call fails


@tool(external_execution=True)
def deploy(service: str) -> str:
    """Deploy a service (the caller runs it)."""
    raise AssertionError("an external call is never run here")


@pytest.fixture
def env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    return settings


def agent(*batch: dict[str, object]) -> Agent:
    script = ScriptConfig(batches=[list(batch)], final_text="Done: {tool_results}")
    return Agent(
        name=f"cli-hitl-{uuid.uuid4().hex[:6]}", model=ScriptedModel(script=script), tools=[pay, send_mail, deploy]
    )


def paused(settings: Settings, payer: Agent) -> str:
    """A run of `payer`, once its tool step has paused it."""
    handle = Client(settings).start(payer.name, input="go")
    assert handle.wait(30).status == S.PAUSED  # wait() returns on PAUSED
    return handle.run_id


def usage(argv: list[str]) -> int:
    """The status of a command line argparse refuses (`main` raises SystemExit for those)."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    return int(refused.value.code or 0)


def out_of(capsys: pytest.CaptureFixture[str]) -> str:
    out, err = capsys.readouterr()
    assert err == "", err
    return out


@pytest.mark.usefixtures("worker")
def test_pending_lists_a_paused_runs_calls_and_approve_and_reject_resume_it(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    payer = agent(
        {"tool": "pay", "arguments": {"amount": 120, "to": "ann"}},
        {"tool": "pay", "arguments": {"amount": 75, "to": "bob"}},
    )
    run_id = paused(env, payer)
    to_ann, to_bob = sorted(Client(env).get_run(run_id).requirements, key=lambda r: r.tool_execution.tool_args["to"])  # type: ignore[union-attr,index]

    assert main(["pending", "--agent", payer.name]) == 0
    head, *rows = out_of(capsys).splitlines()
    assert head.split() == ["RUN", "REQUIREMENT", "AGENT", "TOOL", "ARGUMENTS", "ASKED", "AGE", "DEADLINE"]
    row = next(r for r in rows if to_ann.id in r)
    assert row.startswith(run_id) and payer.name in row and " pay " in row
    assert '{"amount": 120, "to": "ann"}' in row and "confirmation" in row
    assert len(rows) == 2
    # --json: what GET /approvals answers
    assert main(["pending", "--agent", payer.name, "--json"]) == 0
    api = TestClient(create_app(env, client=Client(env)), base_url="http://127.0.0.1")
    assert json.loads(out_of(capsys)) == api.get("/approvals", params={"agent": payer.name}).json()

    assert main(["approve", run_id, to_ann.id, "--by", "ann"]) == 0
    assert out_of(capsys).strip() == f"{to_ann.id}  confirm by ann; run {run_id} is PAUSED"  # one still pending
    assert main(["show", run_id]) == 0
    shown = out_of(capsys)
    assert f"waiting for a person: {to_bob.id}  confirmation  pay(" in shown
    assert f"decided: {to_ann.id}  pay(" in shown and "confirm by ann" in shown

    assert main(["reject", run_id, to_bob.id, "--note", "not this month", "--json"]) == 0
    stored = json.loads(out_of(capsys))
    assert stored["decision"] == {"kind": "reject", "note": "not this month", "values": None, "result": None}
    assert stored["decided_by"] == getpass.getuser()  # no --by: the OS user's name
    done = Client(env).wait(run_id, 30)
    assert done.status == S.COMPLETED and done.run_id == run_id
    assert sorted(m.content or "" for m in done.messages if m.role == "tool") == ["not this month", "paid 120 to ann"]
    assert main(["pending", "--agent", payer.name]) == 0
    assert capsys.readouterr() == ("", "nothing is waiting for a decision\n")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the command line's part: deciding is tested on both
@pytest.mark.usefixtures("worker")
def test_each_refusal_is_the_stores_error_with_its_exit_status(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = paused(env, agent({"tool": "pay", "arguments": {"amount": 5, "to": "ann"}}))
    [req] = Client(env).get_run(run_id).requirements

    assert main(["approve", run_id, "nope"]) == 1
    assert "has no requirement 'nope'" in capsys.readouterr().err
    assert main(["answer", run_id, req.id, "--result", "done"]) == 2  # DecisionKindError: a usage error
    assert "asks for confirmation" in capsys.readouterr().err
    assert usage(["answer", run_id, req.id, "--field", "no-equals-sign"]) == 2
    assert "is not NAME=VALUE" in capsys.readouterr().err
    assert usage(["answer", run_id, req.id]) == 2
    assert "one of the arguments --field --result is required" in capsys.readouterr().err
    assert Client(env).get_run(run_id).requirements[0].status == "pending"  # nothing was stored

    assert main(["reject", run_id, req.id, "--by", "bob"]) == 0
    capsys.readouterr()
    assert Client(env).wait(run_id, 30).status == S.COMPLETED
    assert main(["approve", run_id, req.id, "--by", "ann", "--json"]) == 1
    out, err = capsys.readouterr()
    body = json.loads(err)
    assert out == "" and body["error"]["type"] == "DecisionConflictError" and body["error"]["decided_by"] == "bob"
    assert body["detail"] == body["error"]["message"] and "by bob" in body["detail"]
    assert main(["reject", run_id, req.id, "--by", "bob"]) == 0  # the same decision again: a no-op
    capsys.readouterr()

    cancelled = paused(env, agent({"tool": "pay", "arguments": {"amount": 6, "to": "cy"}}))
    [other] = Client(env).get_run(cancelled).requirements
    assert main(["cancel", cancelled]) == 0
    capsys.readouterr()
    assert main(["approve", cancelled, other.id]) == 1
    assert "CANCELLED, not PAUSED" in capsys.readouterr().err


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the command line's part only
@pytest.mark.usefixtures("worker")
def test_answer_fills_in_fields_as_their_types_and_gives_an_external_result(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    shipper = agent(
        {"tool": "send_mail", "arguments": {"subject": "notes"}}, {"tool": "deploy", "arguments": {"service": "api"}}
    )
    run_id = paused(env, shipper)
    by_type = {r.pause_type: r for r in Client(env).get_run(run_id).requirements}
    mail, ship = by_type["user_input"], by_type["external_execution"]

    assert main(["pending", "--agent", shipper.name]) == 0
    listed = out_of(capsys)
    assert "input: recipient, copies" in listed and "external result" in listed
    assert main(["answer", run_id, mail.id, "--field", "recipient=ann@example.com", "--field", "copies=two"]) == 2
    assert "--field copies: the tool takes a whole number here, not 'two'" in capsys.readouterr().err
    assert main(["answer", run_id, mail.id, "--field", "recipient=ann@example.com", "--field", "copies=2"]) == 0
    assert "input by" in out_of(capsys)
    assert main(["answer", run_id, ship.id, "--result", "deployed by CI, build 42", "--by", "ci"]) == 0
    assert out_of(capsys).strip().startswith(f"{ship.id}  result by ci; run {run_id} is ")

    done = Client(env).wait(run_id, 30)
    assert done.status == S.COMPLETED
    tools = {m.tool_name: m.content for m in done.messages if m.role == "tool"}
    assert tools == {"send_mail": "sent notes to ann@example.com x2", "deploy": "deployed by CI, build 42"}
    [answered] = [r for r in done.requirements if r.id == mail.id]
    assert answered.decision is not None and answered.decision.values == {"recipient": "ann@example.com", "copies": 2}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the command line's part: budgets are tested on both
@pytest.mark.usefixtures("worker")
def test_raise_resumes_a_run_paused_by_its_budget_in_place(env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    # Given a run paused before its second model call: the first spent its one-token budget
    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        return f"found {query}"

    spender = Agent(name=f"cli-budget-{uuid.uuid4().hex[:6]}", model=ScriptedModel(), tools=[lookup], max_tokens=1)
    handle = Client(env).start(spender.name, input="go")
    out = handle.wait(30)
    assert out.status == S.PAUSED
    [req] = out.active_requirements
    assert req.pause_type == "budget" and req.budget is not None and req.budget["limit"] == "max_tokens"

    # A raise not past what was spent is refused as a usage error; one past it resumes the run
    assert main(["raise", handle.run_id, req.id, "--max-tokens", "1"]) == 2
    assert "not above what the run spent" in capsys.readouterr().err
    assert main(["raise", handle.run_id, req.id, "--max-tokens", "1000000", "--by", "ann"]) == 0
    assert out_of(capsys).startswith(f"{req.id}  budget by ann; run {handle.run_id} is ")
    done = Client(env).wait(handle.run_id, 30)
    assert done.status == S.COMPLETED and done.run_id == handle.run_id


def version(agent_name: str, *tools: Tool) -> Agent:
    """A version of the agent `agent_name` (each defined on this line replaces the one before)."""
    script = ScriptConfig(batches=[[{"tool": "pay", "arguments": {"amount": 5, "to": "ann"}}]], final_text="done")
    return Agent(name=agent_name, model=ScriptedModel(script=script), tools=list(tools))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the command line's part: deciding is tested on both
def test_a_decision_on_a_tool_a_deploy_changed_says_what_changed_and_exits_1(
    env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    agent_name = f"cli-hitl-{uuid.uuid4().hex[:6]}"
    with in_memory(env) as inline:  # the steps, inline: the run pauses on `pay`
        run_id = inline.client.start(version(agent_name, pay).name, input="go").run_id
        [req] = inline.client.get_run(run_id).requirements
    # A worker of the next version, without `pay`, booted
    write_served(Client(env).store, [version(agent_name, deploy)])

    assert main(["approve", run_id, req.id]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ratchet: error: ") and "tool 'pay' is gone" in err and "Reject the call instead" in err
    assert main(["approve", run_id, req.id, "--json"]) == 1
    body = json.loads(capsys.readouterr().err)
    assert body["error"]["type"] == "PausedToolChangedError" and body["detail"] == body["error"]["message"]
    assert Client(env).get_run(run_id).requirements[0].status == "pending"  # nothing was stored
