"""Item 6: recovery time. Two worker subprocesses consume the same queues; a run's tool call
stalls on whichever worker took it, which is SIGKILLed as soon as the call starts (no failure
handler runs, nothing is acknowledged). The sweeper (a loop in this process, as `ratchet beat`
would run it) finds the expired lease and publishes the step again; the other worker claims it
and commits. Measured: seconds from the kill to that commit, against the budget of the
configured lease plus one sweep interval.
"""

from __future__ import annotations

import threading
import time

import redis
from sqlalchemy import select

from bench.agents import pop
from bench.env import BenchEnv
from bench.procs import WorkerProcess, ratchet_worker
from bench.stats import Row, Section, median, wait_until
from orchestrator.client import Client
from orchestrator.engine import Engine
from orchestrator.status import RunStatus
from orchestrator.store import Store
from orchestrator.store.schema import messages
from orchestrator.sweeper import Sweeper

LEASE_S, SWEEP_S = 3.0, 0.5


def measure(env: BenchEnv, *, rounds: int, db: str = "pg") -> Section:
    url = env.db_url(db)
    settings = env.settings(
        url, f"recovery-{db}", lease_seconds=LEASE_S, sweep_seconds=SWEEP_S, soft_time_limit=1.5,
        hard_time_limit=2.0, visibility_timeout=30.0, publish_grace_seconds=10.0, model_timeout=1.0,
    )  # fmt: skip
    store = Store.open(url)
    client = Client(settings, store=store)
    r = redis.Redis.from_url(env.redis_url)
    extra = {"BENCH_REDIS_URL": env.redis_url}
    workers: list[WorkerProcess] = [ratchet_worker(env, settings, extra=extra).spawn() for _ in range(2)]
    for w in workers:
        w.wait_ready()
    stop = threading.Event()
    sweeper = Sweeper(Engine(settings, store=store))

    def sweep_loop() -> None:
        while not stop.wait(SWEEP_S):
            sweeper.sweep_once()

    thread = threading.Thread(target=sweep_loop, name="bench-sweeper", daemon=True)
    thread.start()
    samples: list[float] = []
    try:
        for round_ in range(rounds):
            run_id = client.start("bench-recovery", input="stall").run_id
            got = pop(r, f"bench:stall:{run_id}:started", timeout=60)
            if got is None:
                raise TimeoutError("the stalling tool never started")
            pid = int(got)
            victim = next(w for w in workers if w.pid == pid)
            victim.kill()
            killed = time.time()
            record = wait_until(
                lambda: (x := store.get_record(run_id)).status.is_final and x,  # noqa: B023
                60,
                what="the recovered run",
            )
            assert record.status == RunStatus.COMPLETED, record
            with store.engine.connect() as conn:
                committed = conn.execute(
                    select(messages.c.created_at).where(messages.c.run_id == run_id, messages.c.role == "tool")
                ).scalar_one()
            samples.append(committed - killed)
            if round_ + 1 < rounds:  # the next round needs two workers again
                workers[workers.index(victim)] = ratchet_worker(env, settings, extra=extra).start()
    finally:
        stop.set()
        thread.join(5)
        for w in workers:
            w.stop()
    budget = LEASE_S + SWEEP_S
    setup = f"PostgreSQL, 2 worker subprocesses, lease {LEASE_S:g} s, sweep every {SWEEP_S:g} s"
    row = Row("Recovery: SIGKILL mid-step -> the step commits on the other worker", setup, samples, "s")
    row.ratio, row.ratio_note = median(samples) / budget, f"of lease + sweep ({budget:g} s)"
    row.target, row.met = "≤ lease + sweep", max(samples) <= budget
    rows = [row]
    section = Section("Recovery after a worker is killed mid-step", rows=rows)
    section.numbers["recovery_s"] = median(samples)
    section.numbers["recovery_budget_s"] = budget
    return section
