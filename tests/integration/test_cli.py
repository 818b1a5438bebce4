"""The `ratchet` command line, called as a user would, against a real worker on Redis."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from orchestrator import Agent, Client, RunStatus
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.store.tables import runs
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import make_settings, settings_env
from tests.integration.producing import complete, fail
from workers.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


@pytest.fixture
def env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    return settings


@pytest.fixture
def sqlite_env(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """`env` on SQLite only, for what does not depend on the database (the command line's own
    handling, in subprocesses that take a second each to start)."""
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
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


def test_a_run_started_with_a_priority_keeps_it(
    agent_name: str, env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", agent_name, "hello", "--priority", "7"]) == 0
    run_id = capsys.readouterr().out.split()[0]

    assert Client(env).get_run(run_id).priority == 7
    assert main(["show", run_id]) == 0
    assert "  priority 7\n" in capsys.readouterr().out
    assert main(["show", run_id, "--json"]) == 0
    assert '"priority": 7' in capsys.readouterr().out


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
@pytest.mark.parametrize(
    "command", [["show", "nope"], ["continue", "nope"], ["cancel", "nope"], ["show", "run 1"], ["cancel", "run 1"]]
)
def test_an_unknown_run_id_is_a_one_line_error_and_exit_1(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # Not found is a runtime failure (1), not a usage error (2). A lookup takes ids that new runs
    # may not have (runs made before the rule): "run 1" is not found, not malformed.
    assert main(command) == 1
    assert capsys.readouterr().err.strip() == f"ratchet: error: no run with run_id {command[1]!r} in this database"


@pytest.mark.usefixtures("env")
def test_a_worker_without_an_app_module_says_what_to_pass(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RATCHET_APP", raising=False)
    assert main(["worker"]) == 2
    assert "needs --app MODULE" in capsys.readouterr().err
    assert main(["worker", "--app", "no.such.module"]) == 2
    assert "cannot import --app 'no.such.module'" in capsys.readouterr().err
    # A flag neither Ratchet nor Celery takes: Celery's word for it, in one line
    assert main(["worker", "--app", "tests.integration.compose_agents", "--no-such-flag"]) == 2
    assert one_line_error(capsys) == "ratchet: error: celery worker: No such option '--no-such-flag'."


@pytest.mark.usefixtures("env")
def test_an_empty_input_is_refused_before_anything_is_written(
    agent_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", agent_name, "  "]) == 2
    assert "non-empty input" in one_line_error(capsys)


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
    swept = capsys.readouterr().out
    assert re.match(r"requeued \d+, republished \d+, poisoned \d+", swept)
    # Every kind a pass acts on is said, the runs stopped by their deadline and the turns given too
    assert all(f"{kind} 0" in swept for kind in ("timed out", "stopped", "turns", "scheduled", "failed"))
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out.startswith("migrated ")


# ---------------------------------------------------------------- one key, one run


@pytest.mark.usefixtures("env")
def test_running_twice_with_one_run_id_prints_the_same_run(
    agent_name: str, env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"job-{uuid.uuid4().hex[:8]}"
    for _ in range(2):
        assert main(["run", agent_name, "hello", "--session", "cli-keyed", "--run-id", run_id]) == 0
        assert capsys.readouterr().out.strip() == run_id
    session = Client(env).get_session("cli-keyed")
    assert session is not None and [r.run_id for r in session.runs] == [run_id]

    other = Agent(name=f"{agent_name}-b", model=OpenAIChat(id="gpt-4o-mini")).name
    assert main(["run", other, "hello", "--run-id", run_id]) == 1  # a conflict with a stored run: runtime
    assert one_line_error(capsys) == (
        f"ratchet: error: run_id '{run_id}' is already a run of agent '{agent_name}' in session 'cli-keyed'; "
        f"a run of agent '{other}' needs a run_id of its own"
    )


@pytest.mark.usefixtures("env")
def test_continuing_a_completed_run_twice_forks_once_and_a_fork_key_forks_again(
    agent_name: str, env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    client = Client(env)
    source = client.start(agent_name, input="hello").run_id
    complete(client.store, source)

    printed = []
    for argv in (["--input", "more"], ["--input", "more"], ["--input", "more", "--fork-key", "b"], ["--fork-key", "b"]):
        assert main(["continue", source, *argv]) == 0
        printed.append(capsys.readouterr().out.strip())

    assert printed[0] == printed[1] and printed[2] == printed[3]
    assert len({source, printed[0], printed[2]}) == 3


# ---------------------------------------------------------------- mistakes at the door


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "AGENT", "a\x00b"], "input contains a NUL character at index 1"),
        (["run", "AGENT", "hi", "--run-id", "r" * 65], "(65 characters) is not a valid run id: use 1-64 characters"),
        (["run", "AGENT", "hi", "--run-id", "rün"], "run_id 'rün' is not a valid run id"),
        (["run", "AGENT", "hi", "--run-id", "a\nb"], "run_id 'a\\nb' is not a valid run id"),
        (["run", "AGENT", "hi", "--session", "s" * 129], "session_id is 129 characters long; the limit is 128"),
        (["run", "a" * 257, "hi"], "agent is 257 characters long; the limit is 256"),
        (["run", "AGENT", "hi", "--priority", "10"], "priority 10 is out of range: give 0"),
        (["continue", "RUN", "--input", ""], "input is empty"),
        (["continue", "RUN", "--fork-key", "k\x01"], "fork_key 'k\\x01' contains a control character"),
        (["show", "r" * 65], "not a valid run id: run_id is 65 characters long"),
        # Checked before the agent is looked for: a usage error, whether or not the agent is known
        (["run", "no-such-agent", "a\x00b"], "input contains a NUL character at index 1"),
        (["run", "no-such-agent", "hi", "--run-id", "rün"], "run_id 'rün' is not a valid run id"),
    ],
)
def test_a_producer_mistake_is_one_line_and_exit_2(
    argv: list[str], message: str, agent_name: str, env: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    client = Client(env)
    run_id = client.start(agent_name, input="hello").run_id
    fail(client.store, run_id)  # in ERROR, a continue would take new input
    argv = [{"AGENT": agent_name, "RUN": run_id}.get(word, word) for word in argv]
    runs_before = count_runs(client)

    assert main(argv) == 2

    error = one_line_error(capsys)
    assert error.startswith("ratchet: error: ") and message in error
    assert count_runs(client) == runs_before
    assert client.get_run(run_id).status == RunStatus.ERROR


@pytest.mark.parametrize(
    "argv",
    [
        [b"run", b"AGENT", b"caf\xe9"],
        [b"run", b"\xff\xfe", b"hello"],
        [b"run", b"AGENT", b"hello", b"--session", b"s-\xff"],
        [b"show", b"\xff"],
    ],
)
def test_invalid_utf8_on_the_command_line_is_one_line_and_exit_2(argv: list[bytes], sqlite_env: Settings) -> None:
    argv = [b"cli-agent" if word == b"AGENT" else word for word in argv]
    runs_before = count_runs(Client(sqlite_env))

    done = subprocess.run([sys.executable, "-m", "workers.cli", *argv], env=cli_env(), capture_output=True, timeout=60)

    assert done.returncode == 2, done.stderr.decode(errors="replace")
    lines = done.stderr.decode("utf-8").splitlines()
    assert len(lines) == 1 and lines[0].startswith("ratchet: error: ")
    assert "U+DC" in lines[0] or "\\udc" in lines[0]  # the bad bytes, named or shown escaped
    assert count_runs(Client(sqlite_env)) == runs_before


def test_a_worker_with_beat_keeps_its_schedule_out_of_the_working_directory(redis_url: str, tmp_path: Path) -> None:
    # Given a worker with the sweeper's schedule (-B) started in a project folder
    project, temp = tmp_path / "project", tmp_path / "tmp"
    project.mkdir()
    temp.mkdir()
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    env = {**cli_env(), **settings_env(settings), "TMPDIR": str(temp)}
    argv = ["worker", "--app", "tests.integration.compose_agents", "-B", "-P", "threads", "-c", "1"]
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *argv], env=env, cwd=project, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        # When beat has written its schedule, and the worker is stopped
        schedule = wait_until(
            lambda: [*project.glob("celerybeat-schedule*"), *temp.glob("ratchet-beat-*/celerybeat-schedule*")],
            60, what="beat to write its schedule", interval=0.1,
        )  # fmt: skip
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()

    # Then the schedule was in a temp folder, and nothing of it is left
    assert all(temp in path.parents for path in schedule), schedule
    assert list(project.iterdir()) == []
    assert list(temp.iterdir()) == []


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    """What the command printed on stderr, which must be exactly one line."""
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def count_runs(client: Client) -> int:
    with client.store.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(runs)).scalar_one())


def cli_env() -> dict[str, str]:
    """The environment of a `ratchet` subprocess: this one's (the test's RATCHET_* settings) and
    this checkout on the path."""
    return {**os.environ, "PYTHONPATH": str(ROOT)}
