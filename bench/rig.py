"""One database's bench rig: a Ratchet worker and a floor worker (subprocesses, same pool and
concurrency), the producer side of each, and the scripted HTTP server, shared by the per-step,
latency and flatness benchmarks so each worker starts once."""

from __future__ import annotations

from dataclasses import dataclass, field

from celery import Celery
from sqlalchemy import Engine

from bench.env import BenchEnv
from bench.floor import create_floor_app, floor_engine
from bench.procs import WorkerProcess, floor_worker, ratchet_worker, stop_all
from orchestrator.client import Client
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.testing.server import ScriptedServer

POOL, CONCURRENCY = "threads", 4
KEY = "sk-bench-key-for-the-scripted-model"


@dataclass
class Rig:
    """Workers and producers for one database."""

    db: str
    url: str
    settings: Settings
    store: Store
    client: Client
    floor_queue: str
    floor_engine: Engine
    floor_app: Celery
    server: ScriptedServer
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def name(self) -> str:
        return "PostgreSQL" if self.db == "pg" else "SQLite (WAL)"

    @property
    def setup(self) -> str:
        return f"{self.name}, Redis, worker subprocess -P {POOL} -c {CONCURRENCY}"

    def close(self) -> None:
        stop_all(self.workers)
        self.floor_engine.dispose()
        self.floor_app.close()


def spawn_rig(env: BenchEnv, db: str, server: ScriptedServer) -> Rig:
    """Start the rig's workers (not waited for: call `wait_ready` on each)."""
    url = env.db_url(db)
    settings = env.settings(url, f"rig-{db}")
    store = Store.open(url)
    queue = env.queue(f"floor-{db}")
    rig = Rig(
        db=db, url=url, settings=settings, store=store, client=Client(settings, store=store), floor_queue=queue,
        floor_engine=floor_engine(url), floor_app=create_floor_app(env.redis_url, queue), server=server,
    )  # fmt: skip
    extra = {"OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": KEY, "BENCH_REDIS_URL": env.redis_url}
    rig.workers = [
        floor_worker(env, url, queue, pool=POOL, concurrency=CONCURRENCY).spawn(),
        ratchet_worker(env, settings, pool=POOL, concurrency=CONCURRENCY, extra=extra).spawn(),
    ]
    return rig
