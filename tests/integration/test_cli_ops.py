"""`ratchet runs`, `ratchet show --log` and `--steps`, `ratchet prune` and `ratchet delete-session`, called as a
user would on a SQLite store (the store's side is tested on both databases in test_listing.py
and test_retention.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchestrator import RunStatus
from orchestrator.settings import Settings
from orchestrator.store import Store
from tests.conftest import make_settings, settings_env
from tests.integration.stored_runs import rows_of, seed
from workers.cli.commands import main

S = RunStatus


@pytest.fixture
def store(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    settings: Settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url)
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    return Store.open(settings.database_url)


def test_runs_lists_a_page_with_filters_and_says_how_to_get_the_next(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    failed = [seed(store, S.ERROR, agent="mailer", session_id="s1") for _ in range(3)]
    seed(store, S.COMPLETED, agent="mailer")
    seed(store, S.ERROR, agent="other")

    assert main(["runs", "--status", "error", "--agent", "mailer", "--limit", "2"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == failed[::-1][:2]
    assert "ERROR" in lines[0] and "agent=mailer  session=s1" in lines[0] and lines[0].endswith("ModelCallError")
    cursor = err.split("--cursor ")[1].strip()

    assert main(["runs", "--status", "ERROR", "--agent", "mailer", "--limit", "2", "--cursor", cursor, "--json"]) == 0
    page = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in page["runs"]] == [failed[0]] and page["next_cursor"] is None
    assert page["runs"][0]["error"] == {"type": "ModelCallError", "message": "it broke"}

    assert main(["runs", "--status", "COMPLETED", "--status", "ERROR,CANCELLED", "--since", "1h", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["runs"]) == 5


def test_runs_filters_by_user_id_as_run_and_session_name_it(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    ours = seed(store, user_id="u-1")
    seed(store, user_id="u-2")
    seed(store)

    for flag in ("--user-id", "--user"):  # --user: the flag's first name, kept working
        assert main(["runs", flag, "u-1", "--json"]) == 0
        assert [r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]] == [ours]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["runs", "--status", "DONE"], "status 'DONE' is not a run status: use QUEUED, RUNNING"),
        (["runs", "--limit", "0"], "give a whole number of runs from 1 to 1000"),
        (["runs", "--cursor", "nope"], "pass the next_cursor of the previous page as it is"),
        (["runs", "--since", "last tuesday"], "is not a time: give an ISO 8601 date or time"),
        (["prune", "--older-than", "a month"], "is not a duration: give a number of seconds, or a number and a unit"),
        (["prune", "--older-than", "1d", "--status", "QUEUED"], "never live ones: drop QUEUED from status"),
    ],
)
def test_what_these_commands_cannot_take_is_a_one_line_error(
    store: Store, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ratchet: error: ") and says in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "argv, says",
    [
        (["delete-session", "no-such-session"], "no session 'no-such-session' in this database"),
        (["session", "no-such-session"], "no run was ever started in session 'no-such-session'"),
    ],
)
def test_a_session_that_is_not_there_is_a_one_line_error_and_exit_1(
    store: Store, argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("ratchet: error: ") and says in err and len(err.strip().splitlines()) == 1


def test_show_log_prints_what_happened_to_the_run(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = seed(store, S.ERROR)

    assert main(["show", run_id, "--log"]) == 1  # an ERROR run exits 1, as show does
    out = capsys.readouterr().out
    assert "  log:\n" in out and "  error  step 0  to=ERROR" in out

    assert main(["show", run_id, "--log", "--json"]) == 1  # the status does not depend on the format
    (entry,) = json.loads(capsys.readouterr().out)["log"]
    assert entry["kind"] == "error" and entry["detail"]["to"] == "ERROR"


def test_show_steps_prints_each_step_and_the_worker_of_the_one_in_progress(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = seed(store, S.QUEUED)
    assert store.claim(run_id, 0, "model", owner="host-c:9:task-1", lease_seconds=30, max_attempts=5) is not None

    assert main(["show", run_id, "--steps"]) == 0
    out = capsys.readouterr().out
    assert "  steps:\n    step 0  model  running  attempt 1  -  on host-c:9 task task-1\n" in out

    assert main(["show", run_id, "--steps", "--json"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["steps"]
    assert (step["task"], step["status"], step["worker"], step["task_id"]) == ("model", "running", "host-c:9", "task-1")


def test_prune_and_delete_session_say_what_they_deleted(
    store: Store, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store, "clock", lambda: time.time() - 3 * 86400)
    old = [seed(store, S.COMPLETED), seed(store, S.CANCELLED)]
    monkeypatch.setattr(store, "clock", time.time)
    mine = [seed(store, S.COMPLETED, session_id="mine"), seed(store, S.ERROR, session_id="mine")]

    assert main(["prune", "--older-than", "2d"]) == 0
    assert capsys.readouterr().out == "deleted 2 runs\n"
    assert main(["delete-session", "mine"]) == 0
    assert capsys.readouterr().out == "deleted session mine: 2 runs\n"
    assert rows_of(store, old + mine)["runs"] == 0
