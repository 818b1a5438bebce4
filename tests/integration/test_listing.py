"""Listing runs and reading a run's log, on SQLite and PostgreSQL: filters, newest first, pages by
cursor that a run started meanwhile never shifts, member runs only when asked."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator import Agent, Client, RunNotFoundError, RunPage, RunStatus
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store.listing import SUMMARY, RunFilter, ordered
from orchestrator.testing import in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.integration.stored_runs import seed
from tests.unit.test_teams_inline import ResearchTeam

S = RunStatus


class Ticking:
    """A clock a second further on at every read: each run is created at a time of its own."""

    def __init__(self) -> None:
        self.ticks: Iterator[int] = itertools.count()
        self.base = float(int(time.time()) - 86400)  # whole seconds: a datetime holds them exactly

    def __call__(self) -> float:
        return self.base + next(self.ticks)


@pytest.fixture
def store(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Store:
    store = Store.open(settings.database_url)
    monkeypatch.setattr(store, "clock", Ticking())
    return store


@pytest.fixture
def client(settings: Settings, store: Store) -> Client:
    return Client(settings, store=store)


def ids(page: RunPage) -> list[str]:
    return [run.run_id for run in page.runs]


def test_runs_are_listed_newest_first_filtered_by_status_agent_session_user_and_time(
    store: Store, client: Client
) -> None:
    done = seed(store, S.COMPLETED, agent="a", session_id="s1", user_id="u1")
    # A session takes runs for one user only (its first run's): u2's run has a session of its own
    failed = seed(store, S.ERROR, agent="a", session_id="s4", user_id="u2")
    other_failed = seed(store, S.ERROR, agent="b", session_id="s2", user_id="u1")
    cancelled = seed(store, S.CANCELLED, agent="b", session_id="s2", user_id="u1")
    team = seed(store, S.WAITING, agent="t", kind="team", session_id="s3")
    member = seed(store, S.RUNNING, agent="a", parent=team, session_id="s3")

    assert ids(client.list_runs()) == [team, cancelled, other_failed, failed, done]
    assert ids(client.list_runs(status="ERROR")) == [other_failed, failed]
    assert ids(client.list_runs(status=[S.ERROR, "cancelled"])) == [cancelled, other_failed, failed]
    assert ids(client.list_runs(status="ERROR,COMPLETED", agent="a")) == [failed, done]
    assert ids(client.list_runs(agent="a")) == [failed, done]
    assert ids(client.list_runs(session_id="s2")) == [cancelled, other_failed]
    assert ids(client.list_runs(user_id="u1")) == [cancelled, other_failed, done]
    # A team's member runs show under it, unless asked for
    assert ids(client.list_runs(agent="a", members=True)) == [member, failed, done]
    assert ids(client.list_runs(status="RUNNING")) == []
    # since: at or after; until: before. As UNIX seconds, a datetime, ISO 8601 text
    since, until = store.get_record(failed).created_at, store.get_record(cancelled).created_at
    assert ids(client.list_runs(since=since, until=until)) == [other_failed, failed]
    as_text = datetime.fromtimestamp(until, UTC).isoformat()
    assert ids(client.list_runs(since=datetime.fromtimestamp(since, UTC), until=as_text)) == [other_failed, failed]
    # How long ago, by the store's clock (which moves a second a read here)
    assert ids(client.list_runs(since="1h")) == [team, cancelled, other_failed, failed, done]
    assert ids(client.list_runs(since="0s")) == []
    # A summary: the row without the transcript
    (summary,) = client.list_runs(status="ERROR", agent="a").runs
    assert (summary.agent_name, summary.session_id, summary.user_id, summary.kind) == ("a", "s4", "u2", "agent")
    assert summary.error is not None and (summary.error.type, summary.error.message) == ("ModelCallError", "it broke")
    assert summary.n_messages == 1 and summary.created_at == since < summary.updated_at


def test_pages_follow_by_cursor_and_runs_started_meanwhile_shift_no_page(store: Store, client: Client) -> None:
    seeded = [seed(store, S.COMPLETED if i % 3 else S.ERROR) for i in range(7)]
    # One status (one index range), several and any (ranges merged)
    for status in ["COMPLETED", "COMPLETED,ERROR", None]:
        wanted = [r for r in reversed(seeded) if status is None or store.get_record(r).status in status.split(",")]
        pages, cursor = [], None
        while True:
            page = client.list_runs(status=status, limit=3, cursor=cursor)
            pages.append(ids(page))
            seeded.append(seed(store, S.COMPLETED))  # a newer run, started between two pages
            if page.next_cursor is None:
                break
            cursor = page.next_cursor

        assert [run_id for page_ids in pages for run_id in page_ids] == wanted, status
        assert [len(p) for p in pages] == [3] * (len(wanted) // 3) + ([len(wanted) % 3] if len(wanted) % 3 else [])


def test_a_runs_log_holds_its_retries_errors_continues_and_cancel_oldest_first(db_url: str) -> None:
    failing = ScriptConfig(faults=[Fault(status=500, times=None)])
    with in_memory(db_url) as inline:
        agent = Agent(name=f"flaky-{time.monotonic_ns()}", model=ScriptedModel(script=failing), retries=1)
        run = agent.run("hello")
        inline.client.continue_run(run.run_id)
        inline.client.cancel(run.run_id)

        log = inline.client.get_log(run.run_id)

        assert [e.kind for e in log] == ["retry", "error", "continue", "retry", "error", "cancel"]
        assert [e.id for e in log] == sorted(e.id for e in log) and all(e.run_id == run.run_id for e in log)
        retry = log[0]
        assert retry.seq == 1 and retry.detail is not None and retry.detail["error"]["type"] == "InternalServerError"
        assert log[1].detail is not None and log[1].detail["type"] == "InternalServerError"
        assert log[-1].detail is not None and log[-1].detail["to"] == "CANCELLED"
        with pytest.raises(RunNotFoundError):
            inline.client.get_log("no-such-run")


def test_a_teams_log_holds_its_delegation_and_fan_in(db_url: str) -> None:
    with in_memory(db_url) as inline:
        crew = ResearchTeam()
        crew.leader_calls(crew.to(crew.researcher, "otters"))
        run = crew.team.run("write about otters")

        log = inline.client.get_log(run.run_id)

    assert run.status == S.COMPLETED
    assert [e.kind for e in log] == ["delegate", "fan_in", "completed"]
    assert log[0].detail is not None and list(log[0].detail["members"]) == [run.member_runs[0].run_id]


def test_sqlite_reads_a_status_and_agent_page_from_the_partial_listing_index(tmp_path: Path) -> None:
    # The indexes hold no QUEUED or RUNNING run; a query uses them only if it says so word for word
    # (listing.SETTLED). PostgreSQL's plan is checked by tests/integration/test_bench_listing.py.
    store = Store.open(f"sqlite:///{tmp_path / 'runs.db'}")
    plans = {}
    for name, found in {
        "agent": RunFilter(statuses=(S.ERROR,), agent="a"),
        "status": RunFilter(statuses=(S.COMPLETED,), until=1.0, updated_before=1.0),
    }.items():
        statement, params = ordered(found, columns=SUMMARY, limit=51, after=(1.0, "x"))
        compiled = statement.compile(dialect=store.engine.dialect)
        values = compiled.construct_params(params)
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "EXPLAIN QUERY PLAN " + str(compiled), tuple(values[k] for k in compiled.positiontup or ())
            ).all()
        plans[name] = " ".join(str(r[-1]) for r in rows)
    assert "USING INDEX ix_ratchet_runs_agent_listing" in plans["agent"]
    assert "USING INDEX ix_ratchet_runs_status_listing" in plans["status"]
