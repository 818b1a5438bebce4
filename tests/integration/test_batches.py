"""Many runs continued or cancelled at once (`orchestrator.batches`), on SQLite and PostgreSQL,
the steps run inline: by id or by a filter with a status, each run on its own (one refused says
why and the others go on), a bounded batch and the cursor of the next, and the same batch from
Python (`Client.continue_runs`, `cancel_runs`), the command line (`ratchet continue|cancel`) and
the HTTP API (`POST /batches/continue`, `POST /batches/cancel`). A user's token reaching its own runs
only: tests/integration/test_api_access.py; the runs page's batch: tests/integration/test_ui_batches.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from orchestrator import Agent, InvalidInputError, RunStatus
from orchestrator.batches import BATCH_MAX
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.conftest import settings_env
from tests.integration.test_api import JSON, error_of
from workers.api.routes import create_app
from workers.cli.commands import main as ratchet

S = RunStatus


def flaky() -> Agent:
    """An agent whose first call of each run is refused (HTTP 400): the run ends in ERROR, and a
    continue completes it."""
    script = ScriptConfig(final_text="done", faults=[Fault(status=400, times=1, message="refused once")])
    return Agent(name=f"flaky-{uuid.uuid4().hex[:8]}", model=ScriptedModel(script=script))


@pytest.fixture
def inline(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url) as dispatcher:
        yield dispatcher


def failed(agent: Agent, n: int) -> list[str]:
    ids = [agent.run(f"task {i}").run_id for i in range(n)]
    assert {agent.client.get_run(i).status for i in ids} == {S.ERROR}
    return ids


def test_runs_named_by_id_are_continued_each_on_its_own_and_the_refused_say_why(inline: InMemoryDispatcher) -> None:
    agent = flaky()
    client = inline.client
    broken = failed(agent, 2)
    completed = client.continue_runs([broken[0]]).done[0]  # now COMPLETED
    cancelled = failed(agent, 1)[0]
    client.cancel(cancelled)
    unknown = "no-such-run"

    batch = client.continue_runs([broken[1], completed, cancelled, unknown, broken[1]])

    assert [r.run_id for r in batch.results] == [broken[1], completed, cancelled, unknown]  # in order, once each
    ok, done, gone, missing = batch.results
    assert (ok.ok, ok.status, ok.error) == (True, S.COMPLETED, None)
    assert (done.ok, done.status, done.error) == (False, S.COMPLETED, "RunNotContinuableError")
    assert "a batch continues runs in place only" in (done.reason or "")
    assert (gone.ok, gone.status, gone.error) == (False, S.CANCELLED, "RunNotContinuableError")
    assert (missing.ok, missing.status, missing.error) == (False, None, "RunNotFoundError")
    assert batch.done == [broken[1]] and batch.next_cursor is None
    assert client.get_run(completed).status == S.COMPLETED


def test_a_filter_takes_a_bounded_batch_newest_first_and_its_cursor_takes_the_next(
    inline: InMemoryDispatcher,
) -> None:
    agent, other = flaky(), flaky()
    client = inline.client
    mine = failed(agent, 5)
    theirs = failed(other, 1)

    first = client.continue_runs(status="ERROR", agent=agent.name, limit=2)
    second = client.continue_runs(status="error", agent=agent.name, limit=2, cursor=first.next_cursor)
    last = client.continue_runs(status="ERROR", agent=agent.name, limit=2, cursor=second.next_cursor)

    assert first.done == mine[::-1][:2] and second.done == mine[::-1][2:4] and last.done == mine[:1]
    assert first.next_cursor and second.next_cursor and last.next_cursor is None
    assert {client.get_run(i).status for i in mine} == {S.COMPLETED}
    assert client.get_run(theirs[0]).status == S.ERROR  # another agent's: not in the filter
    # A filter's runs are its top-level runs, and the same again finds none left
    again = client.continue_runs(status="ERROR", agent=agent.name)
    assert again.results == [] and again.next_cursor is None


def test_a_batch_names_its_runs_and_at_most_a_hundred_or_nothing_is_done(inline: InMemoryDispatcher) -> None:
    agent = flaky()
    client = inline.client
    broken = failed(agent, 1)
    refusals = {
        "a batch takes at most 100": lambda: client.continue_runs([f"r{i}" for i in range(BATCH_MAX)] + broken),
        "not both": lambda: client.cancel_runs(broken, status="ERROR"),
        "never every run": lambda: client.cancel_runs(agent=agent.name),
        "no run ids given": lambda: client.continue_runs([]),
        "from 1 to 100": lambda: client.continue_runs(status="ERROR", limit=BATCH_MAX + 1),
        "is not a run status": lambda: client.cancel_runs(status="BROKEN"),
    }
    for words, batch in refusals.items():
        with pytest.raises(InvalidInputError, match=words):
            batch()
    assert client.get_run(broken[0]).status == S.ERROR
    assert len(client.continue_runs([f"r{i}" for i in range(BATCH_MAX)]).results) == BATCH_MAX  # the bound itself


def test_a_batch_cancel_cancels_what_has_not_finished_and_refuses_a_completed_run(
    inline: InMemoryDispatcher,
) -> None:
    agent = flaky()
    client = inline.client
    broken = failed(agent, 2)
    inline.autorun = False
    queued = agent.start("never run").run_id
    completed = client.continue_runs([broken[0]]).done[0]
    inline.run_until_idle()

    batch = client.cancel_runs([broken[1], queued, completed])

    assert [(r.ok, r.status) for r in batch.results] == [(True, S.CANCELLED), (True, S.CANCELLED), (False, S.COMPLETED)]
    assert batch.refused[0].error == "RunNotContinuableError"
    assert client.cancel_runs([queued]).done == [queued]  # a run cancelled already: done, as a cancel of one


def test_the_command_line_continues_a_filters_batch_and_refuses_one_runs_options_with_it(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in settings_env(inline.settings).items():
        monkeypatch.setenv(key, value)
    agent = flaky()
    broken = failed(agent, 2)
    capsys.readouterr()

    assert ratchet(["continue", "--status", "error", "--agent", agent.name, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["action"] == "continue" and [r["run_id"] for r in printed["results"]] == broken[::-1]
    assert {r["status"] for r in printed["results"]} == {"COMPLETED"} and printed["next_cursor"] is None

    # A run refused: its line says why, and the status is 1; the others were done
    more = failed(agent, 1)
    assert ratchet(["cancel", more[0], broken[0]]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{more[0]} cancelled CANCELLED"
    assert lines[1].startswith(f"{broken[0]} refused RunNotContinuableError: ")
    assert lines[2] == "cancelled 1, refused 1"
    # One run's options with a batch, or no runs named: a usage error, nothing done
    assert ratchet(["continue", "--status", "ERROR", "--input", "again"]) == 2
    assert "--input take one run" in capsys.readouterr().err
    assert ratchet(["cancel"]) == 2
    assert "name the runs" in capsys.readouterr().err


def test_the_http_api_answers_the_batch_and_a_batch_over_the_bound_is_a_422(inline: InMemoryDispatcher) -> None:
    agent = flaky()
    broken = failed(agent, 3)
    api = TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost")

    answer = api.post("/batches/continue", json={"status": ["ERROR"], "agent": agent.name, "limit": 2}, headers=JSON)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [r["run_id"] for r in body["results"]] == broken[::-1][:2] and body["next_cursor"]
    assert body["results"][0] == {"run_id": broken[2], "ok": True, "status": "COMPLETED", "error": None, "reason": None}
    cancelled = api.post("/batches/cancel", json={"run_ids": [broken[0], "no-such-run"]}, headers=JSON).json()
    assert [(r["ok"], r["error"]) for r in cancelled["results"]] == [(True, None), (False, "RunNotFoundError")]

    over = api.post("/batches/cancel", json={"run_ids": [f"r{i}" for i in range(BATCH_MAX + 1)]}, headers=JSON)
    error_of(over, 422, "RequestValidationError")
    error_of(api.post("/batches/cancel", json={"agent": agent.name}, headers=JSON), 422, "InvalidInputError")
    both = api.post("/batches/continue", json={"run_ids": broken, "status": ["ERROR"]}, headers=JSON)
    assert "not both" in error_of(both, 422, "InvalidInputError")["message"]
