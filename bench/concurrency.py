"""Item 5: I/O-bound concurrency. Many runs at once whose model calls each take 0.5 s (the
scripted HTTP server sleeps), on one worker host; completed steps per second against the floor
with the same pool, concurrency and database: bare Celery chains of the same shape (HTTP call,
transaction, next hop; a hop without the call where Ratchet runs its tool batch).

Each run is model call (asks for the no-op tool) -> tool batch -> model call (final): three
steps, two of which wait 0.5 s. Throughput is all steps over the time from the first enqueue
to the last commit.
"""

from __future__ import annotations

import time
import uuid

from sqlalchemy import func, select

from bench.env import BenchEnv
from bench.floor import chains_done, create_floor_app, floor_engine, start_chain
from bench.procs import floor_worker, ratchet_worker, stop_all
from bench.stats import Row, Section, median, paired_ratios, wait_until
from orchestrator.client import Client
from orchestrator.status import RunStatus
from orchestrator.store import Store
from orchestrator.store.tables import runs as runs_table
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer

KEY = "sk-bench-key-for-the-scripted-model"
STEPS_PER_RUN = 3
DELAY_S = 0.5


def ratchet_throughput(client: Client, store: Store, n_runs: int) -> float:
    t0 = time.time()
    ids = [client.start("bench-io", input="go").run_id for _ in range(n_runs)]

    def done() -> bool:
        with store.engine.connect() as conn:
            return conn.execute(
                select(func.count()).select_from(runs_table)
                .where(runs_table.c.run_id.in_(ids), runs_table.c.status.in_(["COMPLETED", "ERROR"]))
            ).scalar() == n_runs  # fmt: skip

    wait_until(done, 600, interval=0.2, what="the concurrent runs")
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(
                runs_table.c.status, runs_table.c.updated_at, runs_table.c.seq, runs_table.c.error_type,
                runs_table.c.error_message,
            ).where(runs_table.c.run_id.in_(ids))
        ).all()  # fmt: skip
    failed = [r for r in rows if r.status != RunStatus.COMPLETED.value or r.seq != STEPS_PER_RUN]
    assert not failed, f"{len(failed)} runs failed, e.g. {failed[0].error_type}: {failed[0].error_message}"
    return n_runs * STEPS_PER_RUN / (max(r.updated_at for r in rows) - t0)


def floor_throughput(engine: object, app: object, queue: str, io: str, n_runs: int) -> float:
    t0 = time.time()
    ids = [uuid.uuid4().hex for _ in range(n_runs)]
    for run_id in ids:
        start_chain(engine, app, run_id, STEPS_PER_RUN, queue, io=io)  # type: ignore[arg-type]
    times = wait_until(lambda: chains_done(engine, ids), 600, interval=0.2, what="the floor chains")  # type: ignore[arg-type]
    return n_runs * STEPS_PER_RUN / (max(u for _, u in times) - t0)


def measure(
    env: BenchEnv, *, n_runs: int, rounds: int, pool: str, concurrency: int, db: str = "pg"
) -> tuple[Section, dict[str, float]]:
    url = env.db_url(db)
    settings = env.settings(url, f"io-{db}-{concurrency}")
    store = Store.open(url)
    client = Client(settings, store=store)
    queue = env.queue(f"io-floor-{db}-{concurrency}")
    engine = floor_engine(url)
    app = create_floor_app(env.redis_url, queue)
    with ScriptedServer(ScriptConfig(tool_batches=1, delay_s=DELAY_S)) as server:
        extra = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY}
        workers = [
            floor_worker(env, url, queue, pool=pool, concurrency=concurrency).spawn(),
            ratchet_worker(env, settings, pool=pool, concurrency=concurrency, extra=extra).spawn(),
        ]
        try:
            for w in workers:
                w.wait_ready()
            floor_throughput(engine, app, queue, server.url, 4), ratchet_throughput(client, store, 4)  # warm-up
            floor: list[float] = []
            ratchet: list[float] = []
            for _ in range(rounds):
                floor.append(floor_throughput(engine, app, queue, server.url, n_runs))
                ratchet.append(ratchet_throughput(client, store, n_runs))
        finally:
            stop_all(workers)
    engine.dispose()
    app.close()
    ratio = median(paired_ratios(ratchet, floor))
    ideal = concurrency / DELAY_S * STEPS_PER_RUN / 2
    name = "PostgreSQL" if db == "pg" else "SQLite (WAL)"
    setup = f"{name}, {n_runs} runs x {STEPS_PER_RUN} steps, model calls {DELAY_S} s, -P {pool} -c {concurrency}"
    rows = [
        Row(f"Floor: Celery chains, steps/s (-c {concurrency})", setup, floor, "steps/s",
            ratio=median(floor) / ideal, ratio_note=f"of the ideal {ideal:.0f}/s", digits=1),
        Row(f"Ratchet: concurrent runs, steps/s (-c {concurrency})", setup, ratchet, "steps/s",
            ratio=ratio, ratio_note="of floor", target="≥ 0.80x", met=ratio >= 0.8, digits=1),
    ]  # fmt: skip
    section = Section(f"I/O-bound concurrency on {name} (-P {pool} -c {concurrency})", rows=rows)
    return section, {"ratio": ratio, "ratchet": median(ratchet), "floor": median(floor), "ideal": ideal}
