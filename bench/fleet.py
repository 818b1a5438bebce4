"""Several worker processes on one side of a comparison (Ratchet's or the floor's), the scripted
model in a process of its own, and one measured round of many concurrent runs: throughput and
what it cost in CPU (bench/scaling.py, bench/ceiling.py).

The scripted model runs in its own process so that its CPU is neither the producer's nor a
worker's, and is measured apart: on this machine it shares the two cores with everything else."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from celery import Celery

from bench.concurrency import KEY, STEPS_PER_RUN, ratchet_throughput
from bench.cpu import CpuMeter, CpuUse
from bench.env import BenchEnv
from bench.floor import chains_done, create_floor_app, floor_engine, start_chain
from bench.procs import ROOT, WorkerProcess, floor_worker, ratchet_worker, stop_all
from bench.stats import median
from orchestrator.client import Client
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.waiting import wait_until

#: How the floor's hops call the model: through the openai client, as Ratchet's adapter does.
FLOOR_CLIENT = "openai"


@dataclass
class Sample:
    """One measured round: steps a second, and the CPU of the side's workers and of the model."""

    steps_per_s: float
    workers: CpuUse
    model_cores: float
    steps: int

    @property
    def cpu_ms_per_step(self) -> float:
        """The workers' CPU per step (idle workers' upkeep included): what the cores were asked
        for, which moves less with other load on the machine than throughput does."""
        return self.workers.cores * self.workers.seconds / self.steps * 1000


def describe_cpu(samples: Sequence[Sample]) -> str:
    """What the rounds cost in CPU, in words (medians over the rounds)."""
    return (
        f"{median([s.cpu_ms_per_step for s in samples]):.2f} ms CPU a step; workers "
        f"{median([s.workers.cores for s in samples]):.2f} cores, "
        f"the model {median([s.model_cores for s in samples]):.2f}, "
        f"machine {median([s.workers.machine for s in samples]) * 100:.0f}% busy"
    )


@contextmanager
def scripted_model(delay_s: float) -> Iterator[tuple[str, int]]:
    """`python -m orchestrator.testing.server` answering after `delay_s`: (its URL, its pid)."""
    config = ScriptConfig(tool_batches=1, delay_s=delay_s).model_dump_json()
    argv = [sys.executable, "-m", "orchestrator.testing.server", "--config", config]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the scripted model did not start: {line!r}")
        yield line.rsplit(" ", 1)[1].strip(), proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


@dataclass
class Side:
    """One side's workers, and how to start its runs and wait for them. `switched`: the workers
    of `switched_queue` that `use(n)` turns on and off with Celery's remote control."""

    name: str
    workers: list[WorkerProcess] = field(default_factory=list)
    switched: list[WorkerProcess] = field(default_factory=list)
    switched_queue: str = ""
    _on: set[int] = field(default_factory=set)

    @property
    def pids(self) -> list[int]:
        return [w.pid for w in self.workers]

    @property
    def control_app(self) -> Celery:
        raise NotImplementedError

    def use(self, n: int) -> None:
        """Make the first `n` switched workers consume their queue and the others not (Celery's
        `add_consumer` and `cancel_consumer`, each answered before this returns)."""
        control = self.control_app.control
        for i, w in enumerate(self.switched):
            if (i < n) == (i in self._on):
                continue
            command = control.add_consumer if i < n else control.cancel_consumer
            node = _node(w)
            replies = command(self.switched_queue, destination=[node], reply=True, timeout=10)
            if not any(node in r for r in replies or []):
                raise RuntimeError(f"{node} did not answer {command.__name__}: {replies}")
            (self._on.add if i < n else self._on.discard)(i)

    def spawn(self) -> Side:
        for w in self.workers:
            w.spawn()
        return self

    def wait_ready(self) -> None:
        for w in self.workers:
            w.wait_ready(120)

    def stop(self) -> None:
        stop_all(self.workers)

    def throughput(self, n_runs: int) -> float:
        raise NotImplementedError

    def errors(self) -> list[str]:
        """The first few ERROR and CRITICAL lines of the workers' logs."""
        lines = [line for w in self.workers for line in w.log.read_text(errors="replace").splitlines()
                 if "ERROR/" in line or "CRITICAL/" in line]  # fmt: skip
        return [line[:300] for line in lines[:5]]

    def measure(self, n_runs: int, model_pid: int) -> Sample:
        """Start `n_runs` runs at once; steps a second from the first start to the last commit."""
        meter, model = CpuMeter(self.pids).start(), CpuMeter([model_pid]).start()
        steps = self.throughput(n_runs)
        return Sample(steps, meter.stop(), model.stop().cores, n_runs * STEPS_PER_RUN)


class RatchetSide(Side):
    def __init__(self, env: BenchEnv, settings: Settings, model_url: str) -> None:
        super().__init__("Ratchet")
        self.env, self.settings = env, settings
        self.extra = {"OPENAI_BASE_URL": model_url, "OPENAI_API_KEY": KEY}
        self.store = Store.open(settings.database_url)
        self.client = Client(settings, store=self.store)

    @property
    def control_app(self) -> Celery:
        return self.client.dispatcher.app  # type: ignore[attr-defined]

    def add(self, pool: str, concurrency: int, queues: list[str] | None = None, switched: bool = False) -> RatchetSide:
        """One more worker process (not started); `queues` default to all three. A `switched` one
        reads the model queue only while `use` says so."""
        if switched:
            queues = [self.settings.model_queue]
        w = ratchet_worker(self.env, self.settings, pool=pool, concurrency=concurrency, extra=self.extra, queues=queues)
        self.workers.append(w)
        if switched:
            self.switched.append(w)
            self.switched_queue = self.settings.model_queue
            self._on.add(len(self.switched) - 1)
        return self

    def throughput(self, n_runs: int) -> float:
        return ratchet_throughput(self.client, self.store, n_runs)


class FloorSide(Side):
    """Bare Celery chains of the same shape: `queue` for the hops that call the model, `side` (if
    given) for the hops between them, as Ratchet's tool batches have a queue of their own."""

    def __init__(self, env: BenchEnv, db_url: str, model_url: str, name: str, side: bool) -> None:
        super().__init__("floor")
        self.env, self.url, self.model_url = env, db_url, model_url
        self.queue = env.queue(name)
        self.side = env.queue(f"{name}.side") if side else None
        self.engine = floor_engine(db_url)
        self.app = create_floor_app(env.redis_url, self.queue)

    @property
    def control_app(self) -> Celery:
        return self.app

    def add(self, pool: str, concurrency: int, side: bool = False, switched: bool = False) -> FloorSide:
        """One more worker process (not started), on the model hops' queue or on the side queue.
        A `switched` one reads the model hops' queue only while `use` says so."""
        consume = self.side if side else None
        w = floor_worker(self.env, self.url, self.queue, pool=pool, concurrency=concurrency, consume=consume)
        self.workers.append(w)
        if switched:
            self.switched.append(w)
            self.switched_queue = self.queue
            self._on.add(len(self.switched) - 1)
        return self

    def throughput(self, n_runs: int) -> float:
        t0 = time.time()
        ids = [uuid.uuid4().hex for _ in range(n_runs)]
        for run_id in ids:
            start_chain(self.engine, self.app, run_id, STEPS_PER_RUN, self.queue, io=self.model_url,
                        client=FLOOR_CLIENT, side=self.side)  # fmt: skip
        try:
            times = wait_until(lambda: chains_done(self.engine, ids), 120 + n_runs * 0.2, interval=0.2, what="chains")
        except TimeoutError:
            raise TimeoutError(f"the floor's chains did not all finish; its workers said: {self.errors()}") from None
        return n_runs * STEPS_PER_RUN / (max(u for _, u in times) - t0)


def _node(w: WorkerProcess) -> str:
    """The worker's Celery node name (`-n name@%h`, expanded as Celery expands it)."""
    return w.argv[w.argv.index("-n") + 1].replace("%h", socket.gethostname())


def close(*sides: Side) -> None:
    """Stop every worker of these sides (all at once) and release the floor's pools."""
    stop_all([w for s in sides for w in s.workers])
    for s in sides:
        if isinstance(s, FloorSide):
            s.engine.dispose()
            s.app.close()
