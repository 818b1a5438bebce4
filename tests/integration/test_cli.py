"""The `ratchet` command line, called as a user would, against a real worker on Redis."""

from __future__ import annotations

import re
import uuid

import pytest

from orchestrator import Agent, Client, RunStatus
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.testing.server import ScriptedServer
from tests.conftest import settings_env
from workers.cli import main


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


@pytest.fixture
def env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    return settings


@pytest.fixture
def agent_name(env: Settings) -> str:
    name = f"cli-{uuid.uuid4().hex[:6]}"
    Agent(name=name, model=OpenAIChat(id="gpt-4o-mini"), tools=[lookup], instructions="Use lookup.")
    return name


@pytest.mark.usefixtures("worker", "scripted")
def test_run_wait_show_and_continue_a_completed_run(agent_name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", agent_name, "find celery", "--session", "cli-s", "--wait", "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    run_id = out.splitlines()[0]
    assert f"run {run_id}  COMPLETED  agent={agent_name}  session=cli-s" in out
    assert "[2] assistant -> lookup:" in out and "[3] tool: found find celery" in out

    assert main(["show", run_id, "--json"]) == 0
    assert f'"run_id": "{run_id}"' in capsys.readouterr().out

    # Continuing a COMPLETED run forks it: a new run id, the source untouched.
    assert main(["continue", run_id, "--input", "and redis?", "--wait", "--timeout", "30"]) == 0
    fork_out = capsys.readouterr().out
    fork_id = fork_out.splitlines()[0]
    assert fork_id != run_id and f"forked from {run_id}" in fork_out


@pytest.mark.usefixtures("worker")
def test_a_run_that_fails_shows_its_error_and_exits_nonzero(
    agent_name: str, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    scripted.configure(scripted.config.model_copy(update={"reject_keys": ["sk-wrong"]}))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
    assert main(["run", agent_name, "hi", "--wait", "--timeout", "30"]) == 1
    out = capsys.readouterr().out
    assert "ERROR" in out and "error: AuthenticationError" in out


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize("command", [["show", "nope"], ["continue", "nope"], ["cancel", "nope"]])
def test_an_unknown_run_id_is_a_one_line_error(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(command) == 2
    assert capsys.readouterr().err.strip() == "ratchet: error: no run with run_id 'nope' in this database"


@pytest.mark.usefixtures("env")
def test_a_worker_without_an_app_module_says_what_to_pass(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RATCHET_APP", raising=False)
    assert main(["worker"]) == 2
    assert "needs --app MODULE" in capsys.readouterr().err
    assert main(["worker", "--app", "no.such.module"]) == 2
    assert "cannot import --app 'no.such.module'" in capsys.readouterr().err


@pytest.mark.usefixtures("env")
def test_an_empty_input_is_refused_before_anything_is_written(
    agent_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", agent_name, "  "]) == 2
    assert "non-empty input" in capsys.readouterr().err


def test_bad_arguments_print_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run"])
    assert exc.value.code == 2
    assert "usage: ratchet run" in capsys.readouterr().err


@pytest.mark.usefixtures("env")
def test_cancel_then_sweep_and_migrate(agent_name: str, env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    handle = Client(env).start(agent_name, input="never mind")  # no worker: it stays QUEUED
    assert main(["cancel", handle.run_id]) == 0
    assert capsys.readouterr().out.strip() == f"{handle.run_id} CANCELLED"
    assert Client(env).get_run(handle.run_id).status == RunStatus.CANCELLED
    assert main(["sweep"]) == 0
    assert re.match(r"requeued \d+, republished \d+, poisoned \d+", capsys.readouterr().out)
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out.startswith("migrated ")
