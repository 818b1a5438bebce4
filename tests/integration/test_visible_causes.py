"""A run never hides why it does what it does: a team started by a producer that does not import
it shows its member runs; a worker on the wrong database says so; a provider that asks to wait
for an hour stops the run with that reason; a run waiting for a retry says why and until when; a
database error is stored as the driver's message, never as a dump of SQL and parameters.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from orchestrator import Agent, Client, RunStatus
from orchestrator.catalog import write_served
from orchestrator.models import OpenAIChat
from orchestrator.ports import StepRef
from orchestrator.settings import Settings
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from orchestrator.untrusted import error_record
from tests.conftest import settings_env
from tests.integration.test_teams import Ledger, member_runs, research_team, script, to_member
from workers.celery.dispatch import CeleryDispatcher
from workers.cli.commands import main as ratchet

S = RunStatus
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.usefixtures("worker")
def test_a_team_started_by_a_producer_that_does_not_import_it_shows_its_member_runs(
    settings: Settings, scripted: ScriptedServer, tmp_path: Path
) -> None:
    # Given a team the worker knows, started from a command line that does not import it: in the
    # catalog as a worker that serves it writes it at boot (this one started before it was defined)
    team, researcher, writer = research_team(settings, Ledger())
    write_served(Client(settings).store, [team, researcher, writer])
    script(scripted, [to_member(researcher, "find facts"), to_member(writer, "write")])
    env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(ROOT)}
    env.pop("RATCHET_APP", None)
    started = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", team.name, "otters"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()

    out = Client(settings).wait(run_id, timeout=30)

    # Then its members show under it, as for a team started where it is imported
    assert out.status == S.COMPLETED, out.error
    assert set(member_runs(out)) == {"researcher", "writer"}


def test_a_worker_that_does_not_know_a_run_says_so_at_warning_naming_its_database(
    settings: Settings, worker: object, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = str(uuid.uuid4())
    with caplog.at_level(logging.WARNING, logger="ratchet.steps"):
        CeleryDispatcher(settings).publish(StepRef(run_id=run_id, seq=0, kind="model"))
        wait_until(
            lambda: any(run_id in r.getMessage() for r in caplog.records), timeout=20, what="the worker's warning"
        )
    [record] = [r for r in caplog.records if run_id in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "no such run in this worker's database" in record.getMessage()
    database = settings.database_url.rsplit("/", 1)[-1]
    assert database in record.getMessage() and "RATCHET_DATABASE_URL" in record.getMessage()


@pytest.mark.usefixtures("worker")
def test_a_provider_that_asks_to_wait_longer_than_the_cap_stops_the_run_with_that_reason(
    settings: Settings, scripted: ScriptedServer
) -> None:
    scripted.configure(ScriptConfig(faults=[Fault(status=429, retry_after=3600, times=None)]))
    agent = Agent(name=f"patient-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="patient"))

    out = Client(settings).start(agent.name, input="hello").wait(timeout=30)

    assert out.status == S.ERROR and out.error is not None and out.error.type == "RateLimitError"
    assert "asked to wait 3600s" in out.error.message and "RATCHET_MAX_RETRY_AFTER (900s)" in out.error.message
    assert len(scripted.requests_for(out.run_id)) == 1


def test_a_run_waiting_for_a_retry_says_why_and_until_when(
    settings: Settings,
    scripted: ScriptedServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from workers.celery.embedded import EmbeddedWorker

    # Given a provider that asks for two minutes: longer than a countdown waits, so the run is parked
    scripted.configure(ScriptConfig(faults=[Fault(status=429, retry_after=120, times=None)]))
    agent = Agent(name=f"parked-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="parked"))
    client = Client(settings)
    with EmbeddedWorker(settings, sweep=False):
        before = time.time()
        run_id = client.start(agent.name, input="hello").run_id
        wait_until(lambda: client.get_run(run_id).retry is not None, timeout=20, what="the run to be parked")

    out = client.get_run(run_id)
    assert out.status == S.QUEUED and out.retry is not None
    assert out.retry.attempt == 1 and before + 120 <= out.retry.until <= time.time() + 121
    assert out.retry.reason.startswith("RateLimitError: ") and "HTTP 429" in out.retry.reason

    # And `ratchet show` says the same
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert ratchet(["show", run_id]) == 0
    shown = capsys.readouterr().out
    assert "waiting: retry 1 at " in shown and "RateLimitError: " in shown


def test_a_database_error_is_described_by_the_drivers_message_without_sql_or_parameters(db_url: str) -> None:
    engine = create_engine(db_url)
    secret_param = "x" * 300 + " the conversation so far"
    try:
        with pytest.raises(DBAPIError) as raised, engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (v VARCHAR(5) NOT NULL)"))
            conn.execute(text("INSERT INTO t (v) VALUES (:v)"), {"v": secret_param})
            conn.execute(text("INSERT INTO t (v) VALUES (NULL)"))
    finally:
        engine.dispose()

    record = error_record(raised.value)

    assert "INSERT" not in record["message"] and "the conversation so far" not in record["message"]
    assert record["message"].startswith("database error: ") and len(record["message"]) < 300
    assert record["type"] in {"StringDataRightTruncation", "IntegrityError"}
