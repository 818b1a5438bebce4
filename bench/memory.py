"""Item 7: worker memory after many runs. One worker subprocess runs one-step runs (a model
call on the scripted model) in batches; its resident memory is read after
100 runs and then at checkpoints up to the total. No growth beyond noise means the last reading
is within a few MiB of the one after 100 runs."""

from __future__ import annotations

import time

from sqlalchemy import func, select

from bench.env import BenchEnv
from bench.procs import ratchet_worker
from bench.stats import Row, Section, wait_until
from orchestrator.client import Client
from orchestrator.store import Store
from orchestrator.store.tables import runs as runs_table

BATCH = 100
NOISE_MB = 5.0


def measure(env: BenchEnv, *, total: int, db: str = "pg") -> Section:
    url = env.db_url(db)
    settings = env.settings(url, f"mem-{db}")
    store = Store.open(url)
    client = Client(settings, store=store)
    checkpoints = sorted({100, total // 4, total // 2, 3 * total // 4, total})
    readings: dict[int, float] = {}
    t0 = time.monotonic()
    with ratchet_worker(env, settings, concurrency=4) as worker:
        done = 0
        while done < total:
            ids = [client.start("bench-mem", input="go").run_id for _ in range(min(BATCH, total - done))]
            wait_until(lambda: _finished(store, ids), 300, interval=0.05, what="a batch of runs")  # noqa: B023
            done += len(ids)
            if done in checkpoints:
                time.sleep(0.2)
                readings[done] = worker.rss_mb()
    elapsed = time.monotonic() - t0
    first, last = readings[100], readings[total]
    growth = last - first
    rows = [
        Row(f"Worker RSS after {n:,} runs", f"PostgreSQL, worker -P threads -c 4, 1-step runs, batches of {BATCH}",
            [mb], "MiB", ratio=mb / first, ratio_note="vs after 100 runs",
            target=f"≤ +{NOISE_MB:g} MiB" if n == total else "", met=(growth <= NOISE_MB) if n == total else None,
            digits=1)
        for n, mb in sorted(readings.items())
    ]  # fmt: skip
    section = Section(f"Worker memory over {total:,} runs", rows=rows)
    section.numbers.update(memory_mb_after_100=first, memory_mb_after_all=last, memory_growth_mb=growth,
                           memory_runs=float(total), memory_seconds=elapsed)  # fmt: skip
    return section


def _finished(store: Store, ids: list[str]) -> bool:
    with store.engine.connect() as conn:
        n = conn.execute(
            select(func.count()).select_from(runs_table)
            .where(runs_table.c.run_id.in_(ids), runs_table.c.status.in_(["COMPLETED", "ERROR"]))
        ).scalar()  # fmt: skip
    return n == len(ids)
