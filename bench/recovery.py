"""Item 6: recovery time. Two worker subprocesses consume the same queues; a run's tool call
stalls on whichever worker took it, which is SIGKILLed as soon as the call starts (no failure
handler runs, nothing is acknowledged). The sweeper (a loop in this process, every sweep
interval, as one sweeper of a fleet runs) finds the expired lease and publishes the step again;
the other worker claims it and commits. The workers run with RATCHET_WORKER_SWEEPS=false: each
would otherwise sweep too, beside this loop, and the figure would not be one sweeper's. Measured:
seconds from the kill to that commit, twice: with a short lease and a fast sweeper (against the
budget of the lease plus one sweep interval), and with the default settings (lease, heartbeat
and sweep interval as shipped; the target is 30 s).
"""

from __future__ import annotations

import threading
import time

import redis
from sqlalchemy import select

from bench.agents import pop
from bench.env import BenchEnv
from bench.procs import WorkerProcess, ratchet_worker, stop_all
from bench.stats import Row, Section, median, wait_until
from orchestrator.client import Client
from orchestrator.runtime import build
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.steps import StepRunner
from orchestrator.store import Store
from orchestrator.store.tables import messages
from orchestrator.sweeper import Sweeper

LEASE_S, HEARTBEAT_S, SWEEP_S = 3.0, 0.5, 0.5
#: What the issue asks of the default settings: a killed worker's run runs again within this.
DEFAULT_TARGET_S = 30.0


def measure(env: BenchEnv, *, rounds: int, default_rounds: int = 1, db: str = "pg") -> Section:
    url = env.db_url(db)
    short = env.settings(
        url, f"recovery-{db}", lease_seconds=LEASE_S, heartbeat_seconds=HEARTBEAT_S, sweep_seconds=SWEEP_S,
        soft_time_limit=1.5, hard_time_limit=2.0, visibility_timeout=30.0, publish_grace_seconds=10.0,
        model_timeout=1.0,
    )  # fmt: skip
    samples = _recover(env, short, rounds)
    budget = LEASE_S + SWEEP_S
    setup = f"PostgreSQL, 2 worker subprocesses, lease {LEASE_S:g} s, sweep every {SWEEP_S:g} s"
    row = Row("Recovery: SIGKILL mid-step -> the step commits on the other worker", setup, samples, "s")
    row.ratio, row.ratio_note = median(samples) / budget, f"of lease + sweep ({budget:g} s)"
    row.target, row.met = "≤ lease + sweep", max(samples) <= budget
    section = Section("Recovery after a worker is killed mid-step", rows=[row])
    section.numbers["recovery_s"] = median(samples)
    section.numbers["recovery_budget_s"] = budget
    if default_rounds:  # a quick run leaves it to tests/chaos/test_default_recovery.py
        _default_recovery(env, url, default_rounds, section, db)
    return section


def _default_recovery(env: BenchEnv, url: str, rounds: int, section: Section, db: str) -> None:
    """The same, with the default lease, heartbeat and sweep."""
    # Only the database, broker and queues set: what a deployment gets if it changes nothing.
    default = env.settings(url, f"recovery-default-{db}")
    default_samples = _recover(env, default, rounds)
    lease, sweep = default.lease_seconds, default.sweep_seconds
    setup = (
        f"PostgreSQL, 2 worker subprocesses, default settings: lease {lease:g} s "
        f"(heartbeat {default.heartbeat_seconds:g} s), sweep every {sweep:g} s"
    )
    default_row = Row("Recovery with the default settings", setup, default_samples, "s")
    default_row.ratio, default_row.ratio_note = (
        median(default_samples) / (lease + sweep),
        f"of lease + sweep ({lease + sweep:g} s)",
    )
    default_row.target, default_row.met = f"≤ {DEFAULT_TARGET_S:g} s", max(default_samples) <= DEFAULT_TARGET_S
    section.rows.append(default_row)
    section.numbers["recovery_default_s"] = median(default_samples)
    section.numbers["recovery_default_budget_s"] = lease + sweep


def _recover(env: BenchEnv, settings: Settings, rounds: int) -> list[float]:
    """Seconds from each round's kill to the commit of its step on the other worker."""
    store = Store.open(settings.database_url)
    client = Client(settings, store=store)
    r = redis.Redis.from_url(env.redis_url)
    # The loop below is the one sweeper: the workers' own would sweep beside it (each worker sweeps
    # by default), and the killed one may hold the sweep lease.
    extra = {"BENCH_REDIS_URL": env.redis_url, "RATCHET_WORKER_SWEEPS": "false"}
    workers: list[WorkerProcess] = [ratchet_worker(env, settings, extra=extra).spawn() for _ in range(2)]
    for w in workers:
        w.wait_ready()
    stop = threading.Event()
    sweeper = Sweeper(StepRunner(build(settings, store=store)))

    def sweep_loop() -> None:
        while not stop.wait(settings.sweep_seconds):
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
        stop_all(workers)
    return samples
