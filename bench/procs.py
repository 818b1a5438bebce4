"""Worker subprocesses: a Ratchet worker (`ratchet worker --app bench.agents`) or a floor worker
(`celery -A bench.floor:app worker`), started, waited for, measured, stopped or killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from bench.env import BenchEnv, settings_env
from orchestrator.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


class WorkerProcess:
    """One worker subprocess; its output goes to a log file in the bench's scratch folder."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.argv = argv
        self.env = env
        self.log = log
        self.ready_file = log.with_suffix(".ready")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> WorkerProcess:
        """Start and return once Celery says the worker is consuming."""
        return self.spawn().wait_ready(timeout)

    def spawn(self) -> WorkerProcess:
        """Start the process without waiting (start several, then `wait_ready` each)."""
        env = dict(self.env, BENCH_READY_FILE=str(self.ready_file), PYTHONPATH=str(ROOT))
        self.ready_file.unlink(missing_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout: float = 60.0) -> WorkerProcess:
        """Return once Celery says the worker is consuming."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}; see {self.log}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"worker not ready after {timeout}s; see {self.log}")
            time.sleep(0.05)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss_mb(self) -> float:
        """Resident memory of the worker process, in MiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def kill(self) -> None:
        """SIGKILL: no failure handler runs, nothing is acknowledged."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it does not stop in time."""
        stop_all([self], timeout)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_all(workers: Iterable[WorkerProcess], timeout: float = 20.0) -> None:
    """Warm shutdown (SIGTERM) of every worker at once, then SIGKILL for any that has not stopped
    within `timeout`: a Celery worker takes seconds to stop (its consumer sees the signal only once
    its broker read returns), and one after the other they add up."""
    running = [w for w in workers if w.proc is not None and w.proc.poll() is None]
    for w in running:
        assert w.proc is not None
        w.proc.terminate()
    deadline = time.monotonic() + timeout
    for w in running:
        assert w.proc is not None
        try:
            w.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.kill()


def ratchet_worker(
    env: BenchEnv,
    settings: Settings,
    *,
    pool: str = "threads",
    concurrency: int = 4,
    extra: dict[str, str] | None = None,
    queues: list[str] | None = None,
) -> WorkerProcess:
    """`ratchet worker --app bench.agents` for these settings (not started); `queues`: the queues
    it consumes (default: the model, tools and control queues)."""
    # The `ratchet` command, as users start it (it patches for gevent before importing anything)
    argv = [str(Path(sys.executable).parent / "ratchet"), "worker", "--app", "bench.agents", "-P", pool,
            "-c", str(concurrency), "-l", "WARNING", "-n", f"ratchet-{uuid.uuid4().hex[:6]}@%h"]  # fmt: skip
    if queues:
        argv += ["-Q", ",".join(queues)]
    penv = settings_env(settings)
    penv.update(extra or {})
    return WorkerProcess(argv, penv, env.tmp / f"ratchet-worker-{uuid.uuid4().hex[:6]}.log")


def floor_worker(
    env: BenchEnv, db_url: str, queue: str, *, pool: str = "threads", concurrency: int = 4, consume: str | None = None
) -> WorkerProcess:
    """`celery -A bench.floor:app worker` on this database and queue (not started); `consume`: the
    queue it reads, where not `queue` itself (a side queue: `bench.floor.start_chain`)."""
    argv = [sys.executable, "-m", "celery", "-A", "bench.floor:app", "worker", "-Q", consume or queue, "-P", pool,
            "-c", str(concurrency), "-l", "WARNING", "-n", f"floor-{uuid.uuid4().hex[:6]}@%h"]  # fmt: skip
    penv = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    penv.update(BENCH_FLOOR_DB=db_url, BENCH_REDIS_URL=env.redis_url, BENCH_FLOOR_QUEUE=queue)
    return WorkerProcess(argv, penv, env.tmp / f"floor-worker-{uuid.uuid4().hex[:6]}.log")
