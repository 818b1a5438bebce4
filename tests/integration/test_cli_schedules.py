"""`ratchet schedule add|list|rm`, called in process as a user calls it, on a SQLite store: the
schedule stored with its next tick, listed, deleted; a malformed cron or zone is a usage error
(2), an unknown schedule a runtime failure (1), both saying what to do (firing:
tests/unit/test_schedules.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator import Agent
from orchestrator.settings import Settings
from orchestrator.store import Store
from tests.conftest import make_settings, settings_env
from tests.support import CountingModel
from workers.cli.commands import main


@pytest.fixture
def store(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    settings: Settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    return Store.open(settings.database_url)


def test_schedule_add_list_rm_and_the_errors_exit_status(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    Agent(name="reporter", model=CountingModel())  # defined in this process, as an imported module would
    assert main(["schedule", "add", "no-such-agent", "--cron", "@daily", "--input", "x", "--json"]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["type"] == "AgentNotFoundError"
    add = ["schedule", "add", "reporter", "--cron", "0 9 * * mon-fri", "--input", "the report"]
    assert main([*add, "--timezone", "Europe/Paris", "--id", "weekday-report", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["schedule_id"] == "weekday-report" and made["timezone"] == "Europe/Paris"
    assert made["next_at"] > made["created_at"] and made["last_run_id"] is None

    assert main(["schedule", "list"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("weekday-report  agent=reporter  cron='0 9 * * mon-fri' Europe/Paris  next=")
    assert main(["schedule", "list", "--json"]) == 0
    assert [s["schedule_id"] for s in json.loads(capsys.readouterr().out)["schedules"]] == ["weekday-report"]

    assert main([*add, "--cron", "0 25 * * *"]) == 2
    assert "the hour field '25' is not valid" in capsys.readouterr().err
    assert main([*add, "--timezone", "Nowhere/City"]) == 2
    assert "IANA" in capsys.readouterr().err
    assert main([*add, "--id", "weekday-report"]) == 1
    assert "exists already" in capsys.readouterr().err

    assert main(["schedule", "rm", "weekday-report"]) == 0
    assert capsys.readouterr().out == "deleted schedule weekday-report\n"
    assert main(["schedule", "rm", "weekday-report", "--json"]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["type"] == "ScheduleNotFoundError"
    assert store.schedules.all() == []
