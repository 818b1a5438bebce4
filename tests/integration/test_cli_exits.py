"""The `ratchet` command's exit status, called as a user calls it (a subprocess) on the embedded
default in the test's folder (a SQLite file, the filesystem broker): 0 success, 1 a runtime
failure, 2 a usage error, each said in one line or, with --json, as the HTTP API's error body on
stderr; and `ratchet run` refusing an agent that nothing defines before it writes anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from orchestrator import Agent, Client, RunStatus
from orchestrator.catalog import write_served
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.database import open_engine
from orchestrator.store.tables import sessions
from tests.conftest import settings_env
from tests.integration.producing import fail
from tests.integration.stored_runs import TABLES
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
APP, AGENT = "tests.integration.compose_agents", "compose-agent"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    home = tmp_path / ".ratchet"
    return Settings(database_url=f"sqlite:///{home / 'ratchet.db'}", broker_folder=str(home / "broker"))


@pytest.fixture
def ratchet(settings: Settings, tmp_path: Path) -> Any:
    """`ratchet ARGV` in a subprocess on `settings` (and the variables given): its outcome."""

    def run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
        shell = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "OPENAI_"))}
        shell.update(settings_env(settings), PYTHONPATH=str(ROOT), **env)
        return subprocess.run(
            [sys.executable, "-m", "workers.cli", *argv], env=shell, cwd=tmp_path, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip

    return run


def test_help_lists_the_exit_statuses(ratchet: Any) -> None:
    done = ratchet("--help")

    assert done.returncode == 0, done.stderr
    statuses = done.stdout.split("exit status:\n", 1)[1]
    for line in ("  0    success", "  1    a runtime failure: no such run", "  2    a usage error"):
        assert f"\n{line}" in f"\n{statuses}", statuses
    assert '{"detail": <message>, "error": {"type": ..., "message": <message>}}' in statuses


def test_success_is_0_and_what_is_not_there_is_1_in_one_line_or_as_json(ratchet: Any, settings: Settings) -> None:
    run_id = Client(settings).start(AGENT, input="hello").run_id

    cancelled = ratchet("cancel", run_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "CANCELLED"

    missing = ratchet("show", "nope")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == "ratchet: error: no run with run_id 'nope' in this database\n"

    as_json = ratchet("show", "nope", "--json")
    assert (as_json.returncode, as_json.stdout) == (1, "")
    assert json.loads(as_json.stderr) == {
        "detail": "no run with run_id 'nope' in this database",
        "error": {"type": "RunNotFoundError", "message": "no run with run_id 'nope' in this database"},
    }
    session = ratchet("session", "no-such-session", "--json")
    assert session.returncode == 1 and json.loads(session.stderr)["error"]["type"] == "SessionNotFound"


def test_a_usage_error_is_2_and_nothing_is_written(ratchet: Any, settings: Settings) -> None:
    store = Client(settings).store

    # (`ratchet show`: `ratchet cancel` takes a batch too, and refuses naming none as InvalidInputError)
    missing = ratchet("show")
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        "usage: ratchet show [-h] [--log] [--steps] [--json] run_id",
        "ratchet show: error: the following arguments are required: run_id",
    ]
    as_json = ratchet("show", "--json")
    assert as_json.returncode == 2 and json.loads(as_json.stderr) == {
        "detail": "the following arguments are required: run_id",
        "error": {
            "type": "UsageError",
            "message": "the following arguments are required: run_id",
            "usage": "usage: ratchet show [-h] [--log] [--steps] [--json] run_id",
        },
    }
    nothing = ratchet("cancel", "--json")
    assert nothing.returncode == 2 and json.loads(nothing.stderr)["error"]["type"] == "InvalidInputError"
    malformed = ratchet("run", AGENT, "hello", "--run-id", "r" * 65, "--app", APP, "--json")
    assert malformed.returncode == 2, malformed.stderr
    error = json.loads(malformed.stderr)["error"]
    assert error["type"] == "InvalidInputError" and "is not a valid run id" in error["message"]
    assert stored(store) == dict.fromkeys([*TABLES, "sessions"], 0)


def test_a_database_that_cannot_be_reached_is_1_in_one_line_without_its_password(ratchet: Any) -> None:
    url = f"postgresql+psycopg://ratchet:s3cret-pw@127.0.0.1:{free_port()}/ratchet"

    done = ratchet("show", "some-run", RATCHET_DATABASE_URL=url)

    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    shown = url.replace("s3cret-pw", "***")
    assert line.startswith(f"ratchet: error: cannot reach the database at {shown}: "), line
    assert line.endswith("that RATCHET_DATABASE_URL names it (`ratchet health --check database`)")
    assert "s3cret-pw" not in done.stderr
    as_json = ratchet("show", "some-run", "--json", RATCHET_DATABASE_URL=url)
    assert as_json.returncode == 1 and json.loads(as_json.stderr)["error"]["type"] == "DatabaseUnavailable"


def test_a_broker_that_cannot_be_reached_is_1_and_the_error_names_the_run_it_saved(
    ratchet: Any, settings: Settings
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    done = ratchet("run", AGENT, "hello", "--app", APP, "--json", RATCHET_BROKER_URL=nowhere)

    assert (done.returncode, done.stdout) == (1, "")
    error = json.loads(done.stderr)["error"]
    assert error["type"] == "BrokerUnavailableError" and "nothing is lost" in error["message"]
    assert Client(settings).get_run(error["run_id"]).status == RunStatus.QUEUED


def test_a_run_waited_for_is_1_when_it_ended_in_error_or_the_wait_gave_up(ratchet: Any, settings: Settings) -> None:
    client = Client(settings)
    failed = client.start(AGENT, input="hello", run_id="job-1").run_id
    fail(client.store, failed)

    # The same start again (one run id, one request) is the run in ERROR, printed whole, and 1
    again = ratchet("run", AGENT, "hello", "--run-id", failed, "--app", APP, "--wait", "--json")
    assert (again.returncode, again.stderr) == (1, ""), again.stderr
    assert json.loads(again.stdout)["status"] == "ERROR"
    shown = ratchet("show", failed, "--json")
    assert shown.returncode == 1 and json.loads(shown.stdout)["status"] == "ERROR"

    # No worker runs here: the wait gives up, and its error names the run, which goes on
    waited = ratchet("run", AGENT, "hello", "--app", APP, "--wait", "--timeout", "0.2", "--json")
    assert (waited.returncode, waited.stdout) == (1, "")
    error = json.loads(waited.stderr)["error"]
    assert error["type"] == "RunWaitTimeout" and "still going after 0.2s" in error["message"]
    assert client.get_run(error["run_id"]).status == RunStatus.QUEUED


# ---------------------------------------------------------------- an agent nothing defines


def test_run_refuses_an_agent_no_module_and_no_catalog_entry_defines_and_writes_nothing(
    ratchet: Any, settings: Settings
) -> None:
    store = Client(settings).store

    done = ratchet("run", "no-such-agent", "hello")

    assert (done.returncode, done.stdout) == (1, "")
    (line,) = done.stderr.splitlines()
    assert line == (
        "ratchet: error: no agent or team named 'no-such-agent': no module this command imported defines one "
        f"(--app or RATCHET_APP: none), and no worker has served one (the agent catalog in {settings.database_url}); "
        "start a worker whose module defines it (`ratchet worker --app MODULE`), or give this command that module "
        "(--app MODULE); nothing was written"
    )
    with_app = ratchet("run", "no-such-agent", "hello", "--app", APP, "--json")
    assert with_app.returncode == 1
    error = json.loads(with_app.stderr)["error"]
    assert error["type"] == "AgentNotFoundError"  # as POST /runs answers it, with 404
    assert f"(--app or RATCHET_APP: {APP})" in error["message"]
    assert stored(store) == dict.fromkeys([*TABLES, "sessions"], 0)


def test_run_takes_an_agent_a_worker_once_served_without_its_module(ratchet: Any, settings: Settings) -> None:
    # Given an agent a worker served three days ago (no worker serves it now), defined here only
    agent = Agent(name=f"cli-served-{uuid.uuid4().hex[:6]}", model=OpenAIChat(id="gpt-4o-mini"))
    Client(settings).store  # noqa: B018  (opened: migrated)
    then = Store(open_engine(settings.database_url), clock=lambda: time.time() - 3 * 86400)
    try:
        write_served(then, [agent])
    finally:
        then.dispose()

    # When a command line that does not import it starts a run of it, the run is written, waiting
    done = ratchet("run", agent.name, "hello", "--json")

    assert done.returncode == 0, done.stderr
    assert Client(settings).get_run(json.loads(done.stdout)["run_id"]).status == RunStatus.QUEUED


def stored(store: Store) -> dict[str, int]:
    """How many rows each table of runs holds, and the sessions table."""
    with store.engine.connect() as conn:
        counts = {name: conn.execute(select(func.count()).select_from(t)).scalar_one() for name, t in TABLES.items()}
        counts["sessions"] = conn.execute(select(func.count()).select_from(sessions)).scalar_one()
    return counts
