"""Every `ratchet` command that prints, piped into a reader that went away (`ratchet show RUN_ID |
head -1`): it ends quietly with 141, as a command ended by SIGPIPE does, never with a traceback.

Each command runs as a real subprocess on the defaults (a SQLite file and the filesystem broker,
in the test's folder), with stdout a pipe whose reading end is closed before it starts; both with
Python's buffered stdout (the error surfaces at the final flush) and unbuffered (at the print).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import Client
from orchestrator.settings import Settings
from tests.conftest import settings_env

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.compose_agents"
AGENT = "compose-agent"

pytestmark = [pytest.mark.slow]

COMMANDS = {
    "help": ["--help"],
    "show": ["show", "RUN"],
    "show --json": ["show", "RUN", "--json"],
    "run": ["run", AGENT, "hello", "--app", APP],
    "continue": ["continue", "RUN"],
    "cancel": ["cancel", "RUN"],
    "sweep": ["sweep"],
    "migrate": ["migrate"],
    "demo": ["demo"],
    "scripted-model": ["scripted-model", "--port", "0"],
    "worker": ["worker", "--app", APP, "-P", "threads", "-c", "1"],
    "worker -B": ["worker", "--app", APP, "-P", "threads", "-c", "1", "-B"],
    "beat": ["beat"],
}
#: The commands that print nothing on stderr otherwise (no log lines, no banner): into a gone
#: reader they print nothing there at all.
QUIET = {"help", "show", "show --json"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The embedded default, in this test's folder."""
    home = tmp_path / ".ratchet"
    return Settings(database_url=f"sqlite:///{home / 'ratchet.db'}", broker_folder=str(home / "broker"))


def shell(settings: Settings, *, unbuffered: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "OPENAI_", "PYTHONUNBUFFERED"))}
    env.update(settings_env(settings), PYTHONPATH=str(ROOT))
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(params=["buffered", "unbuffered"])
def env(request: pytest.FixtureRequest, settings: Settings) -> dict[str, str]:
    return shell(settings, unbuffered=request.param == "unbuffered")


def into_a_gone_reader(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run `ratchet ARGV` with stdout a pipe nobody reads any more; its exit status and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", *argv], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode(errors="replace")
        return proc.wait(60), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_command_whose_reader_went_away_ends_quietly_with_141(
    command: str, settings: Settings, env: dict[str, str], tmp_path: Path
) -> None:
    run_id = Client(settings).start(AGENT, input="hello").run_id
    argv = [run_id if word == "RUN" else word for word in COMMANDS[command]]

    status, err = into_a_gone_reader(argv, env, tmp_path)

    assert status == 141, err
    for noise in ("Traceback", "BrokenPipeError", "Exception ignored", "Unrecoverable"):
        assert noise not in err
    if command in QUIET:
        assert err == ""


def test_a_command_that_printed_and_then_failed_reports_its_error_not_the_pipe(
    settings: Settings, tmp_path: Path
) -> None:
    # `run --wait` prints the run id (into stdout's buffer), then gives up waiting: no worker
    # runs here. Unbuffered, the print itself would have ended it.
    argv = ["run", AGENT, "hello", "--app", APP, "--wait", "--timeout", "0.2"]

    status, err = into_a_gone_reader(argv, shell(settings, unbuffered=False), tmp_path)

    lines = err.splitlines()
    assert status == 1, err  # a wait that gave up: a runtime failure
    assert len(lines) == 1 and lines[0].startswith("ratchet: error: run ") and "still going after 0.2s" in lines[0]
