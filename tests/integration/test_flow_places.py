"""A run's place among its key's runs when the limiter's Redis was unreachable at the run's end:
the release is lost, and the sweeper frees the place (the store says the run ended) within a
sweep of Redis answering again, instead of RATCHET_RUN_SLOT_SECONDS (900 s) later. On a private
redis-server that keeps every write on disk, which the test kills for the run's last step (a
refused connection delivers nothing) and starts again, and on both databases (the sweeper reads
the places' runs from the store)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator import Agent, RunStatus, Settings
from orchestrator.ports import Ask
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.waiting import wait_until
from tests.flow_support import limited, logged, lookup, name, run_step_of
from tests.servers import RedisServer
from tests.support import CountingModel
from workers.redis import limiter as redis_flow
from workers.redis.limiter import RedisLimiter

S = RunStatus


def test_the_sweeper_frees_the_place_of_a_run_that_ended_while_redis_was_unreachable(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A limiter that failed is not asked again for LOG_EVERY seconds (10): shortened, so that the
    # test waits for the sweep, not for that window
    monkeypatch.setattr(redis_flow, "LOG_EVERY", 0.5)
    server = RedisServer(tmp_path / "redis", persistent=True).start()
    agent = Agent(name=name("places"), model=CountingModel(script=ScriptConfig(tool_batches=1)), tools=[lookup])
    try:
        shared = RedisLimiter(Settings(), server.url)
        with limited(tmp_path, database_url=db_url, max_runs_per_key=1, limiter=shared) as inline:
            assert inline.settings.run_slot_seconds == 900
            watcher = RedisLimiter(inline.settings, server.url)  # another process's view of the places
            # Given a run of user u holding the place, and another parked waiting for it
            holder = agent.start("q", user_id="u").run_id
            run_step_of(inline, holder)
            waiting = agent.start("q", user_id="u").run_id
            run_step_of(inline, waiting)
            assert logged(inline, waiting, "throttled")
            # and a place held by a run this database does not hold (a Redis may serve several)
            assert watcher.admit(Ask(run_id="elsewhere", key="v", limit=1)).admitted

            # When Redis is gone while the holder's last step runs (its release is lost), and back
            server.stop()
            run_step_of(inline, holder)
            server.start()
            assert inline.client.get_run(holder).status == S.COMPLETED
            assert {(p.key, p.run_id) for p in watcher.held()} == {("u", holder), ("v", "elsewhere")}
            assert waiting not in {s.run_id for s in inline.pending}

            # Then a sweep after Redis is back frees it and publishes the waiting run's step,
            # well before the place would have expired by itself
            report = wait_until(lambda: (r := inline.sweep()).freed and r, timeout=15, what="a sweep to free the place")
            assert report.freed == [holder] and report.republished == []
            assert [s.run_id for s in inline.pending] == [waiting]
            # A live run's place, and one of a run of another database, are kept
            assert not inline.sweep().freed
            assert {(p.key, p.run_id) for p in watcher.held()} == {("u", waiting), ("v", "elsewhere")}
            inline.run_until_idle()
            assert inline.client.get_run(waiting).status == S.COMPLETED
            assert {p.run_id for p in watcher.held()} == {"elsewhere"}  # its own release went through
            # The store's read of the places' runs, past its batch of 500
            asked = [holder, "elsewhere", *(f"x-{i}" for i in range(600)), waiting]
            assert inline.store.statuses(asked) == {holder: S.COMPLETED, waiting: S.COMPLETED}
    finally:
        server.stop()
