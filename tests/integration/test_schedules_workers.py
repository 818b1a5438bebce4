"""A schedule fired by a real worker's sweeper (RATCHET_SWEEP_SECONDS 0.5 here), on SQLite and
PostgreSQL: once its tick is due, the worker starts the tick's run, named by the schedule and the
tick, runs it to COMPLETED, and starts no second one on later passes. The tick is made due by
moving the row's `next_at` back to this year's tick, not by waiting for the clock. Ticks, clock
changes, missed ticks and two sweepers at once: tests/unit/test_schedules.py."""

from __future__ import annotations

import datetime as dt
import time
import uuid

from sqlalchemy import update

from orchestrator import Agent, Client, RunNotFoundError, RunOutput, RunStatus, schedules
from orchestrator.models import OpenAIChat
from orchestrator.settings import Settings
from orchestrator.store.tables import schedules as schedule_rows
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until


def ended(client: Client, run_id: str) -> RunOutput | None:
    try:
        return client.store.final_output(run_id)
    except RunNotFoundError:
        return None  # not started yet


def swept_since(client: Client, moment: float) -> bool:
    lease = client.store.lease("sweeper")
    return lease is not None and lease.renewed_at > moment


def test_a_workers_sweeper_starts_one_run_for_a_due_tick(
    settings: Settings, scripted: ScriptedServer, worker: object
) -> None:
    client = Client(settings)
    agent = Agent(name=f"sched-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id="gpt-4o-mini"), client=client)
    client.schedule(agent.name, cron="@yearly", input="the yearly digest", schedule_id="digest")
    year = dt.datetime.now(dt.UTC).year
    tick = dt.datetime(year, 1, 1, tzinfo=dt.UTC).timestamp()  # this year's tick, as if nothing had fired it
    with client.store.engine.begin() as conn:
        conn.execute(update(schedule_rows).where(schedule_rows.c.schedule_id == "digest").values(next_at=tick))

    run_id = schedules.run_id_for("digest", tick)
    done = wait_until(lambda: ended(client, run_id), 30, what="the tick's run to end")
    assert done.status == RunStatus.COMPLETED
    (moved,) = client.schedules()
    assert moved.last_run_id == run_id and moved.next_at == dt.datetime(year + 1, 1, 1, tzinfo=dt.UTC).timestamp()
    after = time.time()  # a pass after the run ended starts no second one
    wait_until(lambda: swept_since(client, after), 10, what="another sweep")
    assert [r.run_id for r in client.list_runs(agent=agent.name).runs] == [run_id]
