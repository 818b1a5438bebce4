"""Deleting runs, on SQLite and PostgreSQL: a session with everything stored for its runs (Redis
streams too), and a prune of old stopped runs, also while other threads write new runs and
continue old ones; nothing live, nothing new and no member of a live team is ever deleted."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
import redis
from sqlalchemy import insert

from orchestrator import Agent, Client, InvalidInputError, RunLiveError, RunStatus, tool
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.store import retention as retention_module
from orchestrator.store.tables import deltas
from orchestrator.testing import in_memory
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.conftest import make_settings
from tests.integration.stored_runs import rows_of, seed, session_exists
from tests.unit.test_teams_inline import ResearchTeam
from workers.redis.delta_sink import KEY

S = RunStatus
DAY = 86400.0
LIVE = (S.QUEUED, S.RUNNING, S.WAITING, S.PAUSED)
STOPPED = (S.COMPLETED, S.ERROR, S.CANCELLED)


@tool(at_most_once=True)
def charge(amount: int) -> str:
    """Charge the card."""
    return f"charged {amount}"


def test_deleting_a_session_removes_its_runs_members_messages_tool_starts_log_live_events_and_nothing_else(
    db_url: str, redis_url: str
) -> None:
    settings = make_settings(db_url, redis_url, stream_ttl=120)
    with in_memory(settings) as inline:
        # Given a session with a streamed team run (members, a log, Redis streams) and a run that
        # started an at-most-once tool, and another session
        crew = ResearchTeam()
        crew.leader_calls(crew.to(crew.researcher, "otters"), crew.to(crew.writer, "otters"))
        team = inline.client.start(crew.team.name, input="otters", session_id="forget-me", stream=True).wait(10)
        script = ScriptConfig(batches=[[{"tool": "charge", "arguments": {"amount": 5}}]], final_text="done")
        payer = Agent(name=f"payer-{uuid.uuid4().hex[:6]}", model=ScriptedModel(script=script), tools=[charge])
        paid = payer.run("pay", session_id="forget-me")
        kept = payer.run("pay", session_id="keep-me")
        gone = [team.run_id, *(m.run_id for m in team.member_runs), paid.run_id]
        streams = redis.Redis.from_url(redis_url)
        assert streams.exists(*(KEY.format(run_id=r) for r in gone[:3])) == 3
        assert all(n > 0 for name, n in rows_of(inline.store, gone).items() if name != "deltas")

        # When the session is deleted
        deleted = inline.client.delete_session("forget-me")

        # Then everything stored for its runs is gone, Redis streams too; the other session is whole
        assert deleted is not None and deleted.runs == 4 and set(deleted.streamed) == set(gone[:3])
        assert rows_of(inline.store, gone) == dict.fromkeys(rows_of(inline.store, gone), 0)
        assert streams.exists(*(KEY.format(run_id=r) for r in gone)) == 0
        assert inline.client.get_session("forget-me") is None and not session_exists(inline.store, "forget-me")
        assert [r.run_id for r in inline.client.get_session("keep-me").runs] == [kept.run_id]  # type: ignore[union-attr]
        assert rows_of(inline.store, [kept.run_id])["tool_starts"] == 1
        assert inline.client.delete_session("forget-me") is None  # an unknown session: nothing to do
        streams.close()


def test_a_session_with_a_live_run_is_refused_naming_the_run_and_nothing_is_deleted(settings: Settings) -> None:
    store = Store.open(settings.database_url)
    client = Client(settings, store=store)
    for live in LIVE:
        done = seed(store, S.COMPLETED, session_id=f"busy-{live}")
        going = seed(store, live, session_id=f"busy-{live}")

        with pytest.raises(
            RunLiveError, match=f"live run, {going} \\({live.value}\\).*ratchet cancel {going}"
        ) as caught:
            client.delete_session(f"busy-{live}")

        assert caught.value.run_id == going
        assert rows_of(store, [done, going])["runs"] == 2 and session_exists(store, f"busy-{live}")


def test_a_member_of_a_live_team_keeps_the_session_whole(settings: Settings) -> None:
    store = Store.open(settings.database_url)
    team = seed(store, S.WAITING, kind="team", session_id="crew")
    member = seed(store, S.COMPLETED, parent=team, session_id="crew")

    with pytest.raises(RunLiveError) as caught:
        Client(settings, store=store).delete_session("crew")

    assert caught.value.run_id == team and rows_of(store, [team, member])["runs"] == 2


def old_world(store: Store, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Runs written 40 days ago: stopped ones (one with an at-most-once tool start), live ones,
    a stopped team whose member is live, a stopped team with stopped members (one streamed row
    in ratchet_deltas); by kind."""
    monkeypatch.setattr(store, "clock", lambda: time.time() - 40 * DAY)
    world: dict[str, list[str]] = {"stopped": [], "live": [], "kept_tree": [], "gone_tree": [], "errors": []}
    for i in range(30):
        world["stopped"].append(seed(store, STOPPED[i % 3], started=i == 0))
    world["errors"] = [r for i, r in enumerate(world["stopped"]) if i % 3 == 1]
    world["live"] = [seed(store, LIVE[i % 4]) for i in range(8)]
    team = seed(store, S.ERROR, kind="team")
    world["kept_tree"] = [team, seed(store, S.RUNNING, parent=team), seed(store, S.ERROR, parent=team)]
    team = seed(store, S.COMPLETED, kind="team")
    inner = seed(store, S.COMPLETED, kind="team", parent=team)
    world["gone_tree"] = [team, inner, seed(store, S.COMPLETED, parent=inner), seed(store, S.CANCELLED, parent=team)]
    with store.engine.begin() as conn:
        conn.execute(insert(deltas).values(run_id=team, event_id="1.2.3.4", body="{}", created_at=time.time()))
    monkeypatch.setattr(store, "clock", time.time)
    return world


def test_prune_deletes_old_stopped_runs_with_their_members_and_keeps_live_runs_and_live_teams(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(settings.database_url)
    world = old_world(store, monkeypatch)
    recent = seed(store, S.COMPLETED)
    client = Client(settings, store=store)

    # Only the statuses asked for: ERROR runs (and the team whose member is live: kept)
    only_errors = client.prune("30d", status="ERROR")
    assert only_errors.runs == len(world["errors"]) and only_errors.kept == (world["kept_tree"][0],)
    assert rows_of(store, world["errors"])["runs"] == 0

    report = client.prune("30d")

    others = [r for r in world["stopped"] if r not in world["errors"]]
    assert report.runs == len(others) + len(world["gone_tree"])
    assert rows_of(store, others + world["gone_tree"]) == dict.fromkeys(rows_of(store, others), 0)
    assert rows_of(store, world["live"] + world["kept_tree"] + [recent])["runs"] == 8 + 3 + 1
    assert report.kept == (world["kept_tree"][0],)
    assert client.prune(30 * DAY).runs == 0  # nothing left to prune


def test_prune_refuses_live_statuses_and_ages_it_cannot_read(redis_url: str, tmp_path: Path) -> None:
    client = Client(make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_url))  # refused before any read
    with pytest.raises(InvalidInputError, match="never live ones: drop RUNNING, PAUSED from status"):
        client.prune("30d", status=["COMPLETED", "RUNNING", "paused"])
    for age, says in [("a month", "is not a duration"), (-1, "zero or more"), ("30 days", "is not a duration")]:
        with pytest.raises(InvalidInputError, match=says):
            client.prune(age)


def test_a_prune_while_runs_are_written_and_continued_deletes_every_old_stopped_run_and_nothing_live_or_new(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.open(settings.database_url)
    world = old_world(store, monkeypatch)
    new: list[str] = []
    continued: list[str] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def write_new_runs() -> None:
        try:
            while not stop.is_set():
                new.append(seed(store, STOPPED[len(new) % 3], agent="writer"))
        except BaseException as exc:  # reported by the test, not lost in the thread
            failures.append(exc)

    def continue_old_errors() -> None:
        try:
            for run_id in world["errors"][::2]:
                moved = store.move(run_id, src=(S.ERROR,), dst=S.QUEUED, bump_epoch=True, event="continue",
                                   publish_grace=60)  # fmt: skip
                if moved is not None:
                    continued.append(run_id)
        except BaseException as exc:
            failures.append(exc)

    # When a prune in small batches runs while two threads write new runs and one continues old ones
    threads = [threading.Thread(target=write_new_runs) for _ in range(2)]
    threads.append(threading.Thread(target=continue_old_errors))
    for t in threads:
        t.start()
    try:
        report = retention_module.prune(store, cutoff=time.time() - 30 * DAY, batch=5)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not failures, failures

    # Then every old stopped run is gone but those continued before their batch; nothing live or new went
    gone = [r for r in world["stopped"] + world["gone_tree"] if r not in continued]
    assert rows_of(store, gone) == dict.fromkeys(rows_of(store, gone), 0)
    assert rows_of(store, continued + world["live"] + world["kept_tree"] + new)["runs"] == (
        len(continued) + len(world["live"]) + len(world["kept_tree"]) + len(new)
    )
    assert report.runs == len(gone) and len(new) > 0
