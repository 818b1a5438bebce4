"""Reusable parts of the chaos tests: a private Redis, worker subprocesses, a sweeper, waits
with deadlines, and the invariants every chaos test checks.

    with Cluster(tmp_path, db_url, model=scripted) as cluster:
        worker = cluster.start_worker()
        run_id = cluster.start_run()
        pid = cluster.wait_model_call(run_id, seq=0)
        os.kill(pid, signal.SIGKILL)
        cluster.wait_final([run_id])
        cluster.assert_invariants([run_id], extra_model_calls=1)

Each cluster has its own redis-server (so a test may restart it), its own queues, and workers
started with `python -m workers.cli worker --app tests.chaos.agents` in their own session, so
a signal can reach a worker's whole process tree. Nothing sleeps and hopes: tests wait for a
condition (a file a tool wrote, a row, a log entry of the model server) with a deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from orchestrator.client import Client
from orchestrator.messages import Message
from orchestrator.run import RunOutput
from orchestrator.runtime import build
from orchestrator.settings import Settings
from orchestrator.status import RunStatus
from orchestrator.steps import StepRunner
from orchestrator.store import Store, forget_stores
from orchestrator.store.tables import messages as messages_table
from orchestrator.sweeper import Sweeper
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.chaos import agents
from tests.servers import RedisServer
from workers.celery.dispatch import CeleryDispatcher

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-chaos-test-key-for-the-scripted-model"

#: Limits for chaos runs: short, and as production's are (soft < hard < visibility; a lease of a
#: few heartbeats, which a live worker renews however long its step runs). The time limits leave
#: room: getting somewhere in a step (a tool started, results or other runs committed) can take
#: seconds on a loaded machine (chaos tests run two at a time), and a test that does not test the
#: limits must not have a step end at one.
CHAOS_SETTINGS: dict[str, Any] = {
    "soft_time_limit": 5.0,
    "hard_time_limit": 5.5,
    "lease_seconds": 4.0,
    "heartbeat_seconds": 1.0,
    "visibility_timeout": 10.0,
    "sweep_seconds": 0.25,
    "publish_grace_seconds": 1.5,
    "max_step_attempts": 3,
    "model_timeout": 10.0,
    "max_countdown": 5.0,
    # A SQLite file synced at checkpoints only (still safe against a killed process in WAL mode):
    # a synced commit took 4 ms on this machine's disk, a wait every step of a chaos run paid.
    "sqlite_synchronous": "NORMAL",
}

#: Celery flags of every chaos worker. No mingle: a starting worker asks the others for the tasks
#: they revoked and waits a second for their answers (a second of every worker's start, a quarter
#: of it here); Ratchet revokes no task (the database decides what runs), so none has one to give.
WORKER_FLAGS = ["--without-mingle"]

#: For the tests of the time limits themselves: reached soon (soft 2 s < hard 3 s < lease 4 s).
TIME_LIMITS: dict[str, Any] = {"soft_time_limit": 2.0, "hard_time_limit": 3.0}

#: For tests whose recovery waits out a lease of a step that kills its worker by itself (or is
#: cut short by the broker). The time limits stay as they are: a lease no longer has to outlast them.
SHORT_LEASE: dict[str, Any] = {"lease_seconds": 2.0, "heartbeat_seconds": 0.5}


# ---------------------------------------------------------------- workers


class Worker:
    """A `ratchet worker` subprocess in its own session (its pid is its process group)."""

    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.proc = proc
        self.log_path = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal_all(self, sig: signal.Signals) -> None:
        """Send `sig` to the worker's main process and every pool process."""
        os.killpg(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and pool), as a lost node would die."""
        with suppress(ProcessLookupError):
            self.signal_all(signal.SIGKILL)
        self.proc.wait(10)

    def alive(self) -> bool:
        return self.proc.poll() is None


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its parent counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state not in ("Z", "X")


# ---------------------------------------------------------------- the cluster


class Cluster:
    """One test's world: Redis, the run store, the scripted model, workers and a sweeper."""

    def __init__(self, root: Path, db_url: str, model: ScriptedServer, **overrides: Any) -> None:
        self.root = root
        self.dir = root / "chaos"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.redis = RedisServer(root / "redis").start()
        tag = uuid.uuid4().hex[:8]
        values = {
            **CHAOS_SETTINGS, "database_url": db_url, "broker_url": self.redis.url,
            "model_queue": f"c.{tag}.model", "tools_queue": f"c.{tag}.tools", "control_queue": f"c.{tag}.control",
            **overrides,
        }  # fmt: skip
        self.settings = Settings.model_validate(values)
        self.store = Store.open(db_url)
        agents.ledger.create_all(self.store.engine)
        self.dispatcher = CeleryDispatcher(self.settings)
        self.client = Client(self.settings, store=self.store, dispatcher=self.dispatcher)
        self.workers: list[Worker] = []
        self._sweeping = threading.Event()
        self._sweeper: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a subprocess that shares this cluster's settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
        env.update({f"RATCHET_{k.upper()}": str(v) for k, v in self.settings.model_dump().items() if v is not None})
        env.update(
            OPENAI_BASE_URL=self.model.url, OPENAI_API_KEY=API_KEY, PYTHONPATH=str(ROOT),
            **{agents.CHAOS_DIR: str(self.dir)}, **extra,
        )  # fmt: skip
        return env

    def start_worker(
        self, *, concurrency: int = 2, beat: bool = False, pool: str = "prefork", queues: Iterable[str] = (),
        apps: Iterable[str] = ("tests.chaos.agents",), env: dict[str, str] | None = None, sweeps: bool = False,
    ) -> Worker:  # fmt: skip
        """Start a worker importing `apps` (with `env` added to its environment); return once it consumes."""
        worker = self.spawn_worker(
            concurrency=concurrency, beat=beat, pool=pool, queues=queues, apps=apps, env=env, sweeps=sweeps
        )
        self.wait_ready(worker)
        return worker

    def start_workers(self, count: int, **options: Any) -> list[Worker]:
        """Start `count` workers at once (`start_worker`'s options) and return once all consume."""
        workers = [self.spawn_worker(**options) for _ in range(count)]
        for worker in workers:
            self.wait_ready(worker)
        return workers

    def spawn_worker(
        self, *, concurrency: int = 2, beat: bool = False, pool: str = "prefork", queues: Iterable[str] = (),
        apps: Iterable[str] = ("tests.chaos.agents",), env: dict[str, str] | None = None, sweeps: bool = False,
    ) -> Worker:  # fmt: skip
        """Start a worker process; `wait_ready` waits until it consumes. It runs no sweeper of its
        own unless `sweeps` (as every worker does by default): a test says when sweeps happen
        (`start_sweeper`, beat, or workers that sweep)."""
        name = f"w{len(self.workers) + 1}-{uuid.uuid4().hex[:4]}@chaos"
        log = self.root / f"{name.split('@')[0]}.log"
        argv = [sys.executable, "-m", "workers.cli", "worker", "-P", pool, "-c", str(concurrency), "-n", name,
                "-l", "INFO", *WORKER_FLAGS]  # fmt: skip
        for app in apps:
            argv += ["--app", app]
        if queues:
            argv += ["-Q", ",".join(queues)]
        if beat:
            argv.append("-B")
        with log.open("wb") as out:
            extra = {"RATCHET_WORKER_SWEEPS": "true" if sweeps else "false", **(env or {})}
            proc = subprocess.Popen(
                argv, env=self.env(**extra), cwd=self.root, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        worker = Worker(name, proc, log)
        self.workers.append(worker)
        return worker

    def wait_ready(self, worker: Worker) -> None:
        """Return once the worker consumes; fail if it died first."""
        wait_until(
            lambda: (self.dir / f"ready-{worker.name}").exists() or not worker.alive(),
            timeout=30,
            what=f"worker {worker.name} to start",
        )
        assert worker.alive(), f"worker {worker.name} died at start:\n{worker.log()[-3000:]}"

    def start_sweeper(self) -> None:
        """Sweep every RATCHET_SWEEP_SECONDS in a thread of the test (what beat does in production)."""
        engine = StepRunner(build(self.settings, store=self.store, dispatcher=self.dispatcher))
        sweeper = Sweeper(engine)

        def loop() -> None:
            while not self._sweeping.wait(self.settings.sweep_seconds):
                with suppress(Exception):  # a broker or database blip: the next pass retries
                    sweeper.sweep_once()

        self._sweeper = threading.Thread(target=loop, name="chaos-sweeper", daemon=True)
        self._sweeper.start()

    def close(self) -> None:
        self._sweeping.set()
        if self._sweeper is not None:
            self._sweeper.join(10)
        for worker in self.workers:
            worker.kill()
        self.dispatcher.app.close()
        self.redis.stop()
        forget_stores()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ steering

    def script(self, **fields: Any) -> None:
        """Replace the scripted model's script (fault budgets reset)."""
        self.model.configure(ScriptConfig(**fields))

    def flag(self, name: str) -> Path:
        """Create a steering file (see tests/chaos/agents.py)."""
        path = self.dir / name
        path.touch()
        return path

    def unflag(self, name: str) -> None:
        (self.dir / name).unlink(missing_ok=True)

    def start_run(self, text_in: str = "hello", *, run_id: str | None = None, stream: bool = False) -> str:
        return self.client.start(agents.AGENT, input=text_in, run_id=run_id, stream=stream).run_id

    def events(self, run_id: str) -> list[str]:
        return [e["kind"] for e in self.store.get_events(run_id)]

    def wait_model_call(self, run_id: str, seq: int, *, timeout: float = 20) -> int:
        """Wait until the model server has received step `seq`'s call; the pid that makes it."""
        wait_until(
            lambda: any(r["step"] == str(seq) for r in self.model.requests_for(run_id)),
            timeout=timeout, what=f"the model call of step {seq} of run {run_id}",
        )  # fmt: skip
        markers = list(self.dir.glob(f"model-{run_id}-{seq}.*"))
        assert len(markers) == 1, markers
        return int(markers[0].suffix[1:])

    def wait_tool_started(self, key: str, *, timeout: float = 60) -> int:
        """Wait until a process started tool call `key`; its pid. The deadline covers a worker
        process's start and the model step before the tool, on a loaded machine (20 s was
        missed once with the whole suite running beside it)."""
        found = wait_until(
            lambda: list(self.dir.glob(f"started-{key}.*")), timeout=timeout, what=f"tool call {key} to start"
        )
        return int(found[0].suffix[1:])

    def wait_status(self, run_id: str, *statuses: RunStatus, timeout: float = 20) -> RunOutput:
        wait_until(
            lambda: self.store.get_record(run_id).status in statuses,
            timeout=timeout, what=f"run {run_id} to be {'/'.join(statuses)}",
        )  # fmt: skip
        return self.store.get_output(run_id)

    def wait_final(self, run_ids: Iterable[str], *, timeout: float = 40) -> dict[str, RunOutput]:
        """Every run reaches COMPLETED or ERROR within `timeout` (the first invariant)."""
        ids = list(run_ids)
        final = (RunStatus.COMPLETED, RunStatus.ERROR)
        try:
            wait_until(
                lambda: all(self.store.get_record(r).status in final for r in ids),
                timeout=timeout, what=f"runs {ids} to reach COMPLETED or ERROR", interval=0.05,
            )  # fmt: skip
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.diagnose(ids)}") from None
        return {r: self.store.get_output(r) for r in ids}

    def diagnose(self, run_ids: Iterable[str]) -> str:
        lines = []
        for run_id in run_ids:
            record = self.store.get_record(run_id)
            lines.append(f"run {run_id}: {record}")
            lines += [f"  event {e}" for e in self.store.get_events(run_id)]
        for worker in self.workers:
            lines.append(f"--- {worker.name} (alive={worker.alive()}) log tail:\n{worker.log()[-4000:]}")
        return "\n".join(lines)

    # ------------------------------------------------------------ reading the ledger

    def attempts(self, run_id: str) -> Counter[str]:
        """How many times each tool call (by key) started executing."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(select(agents.attempts.c.key).where(agents.attempts.c.run_id == run_id))
            return Counter(r.key for r in rows)

    def attempted_calls(self, run_id: str, key: str) -> set[str]:
        """The tool_call_ids that the executions of call `key` saw in their ToolContext."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                select(agents.attempts.c.tool_call_id).where(
                    agents.attempts.c.run_id == run_id, agents.attempts.c.key == key
                )
            )
            return {r.tool_call_id for r in rows}

    def effect_rows(self, run_id: str) -> list[tuple[str, str, int]]:
        """(tool_call_id, key, pid) of every time a side effect took place, in order."""
        table = agents.effects
        with self.store.engine.connect() as conn:
            query = select(table.c.tool_call_id, table.c.key, table.c.pid).where(table.c.run_id == run_id)
            rows = conn.execute(query.order_by(table.c.id))
            return [(r.tool_call_id, r.key, r.pid) for r in rows]

    def effects(self, run_id: str) -> dict[str, str]:
        """tool_call_id -> key of every side effect that took place; fails if one took place twice."""
        rows = self.effect_rows(run_id)
        self._assert_no_double_effect(run_id, rows)
        return {call_id: key for call_id, key, _ in rows}

    def model_calls(self, run_id: str) -> Counter[int]:
        """Model calls the scripted server received per step of the run."""
        return Counter(int(r["step"]) for r in self.model.requests_for(run_id))

    def answer_epochs(self, run_id: str) -> list[int | None]:
        """The claim epoch each of the run's assistant messages was written under, in order. A step
        taken back after its worker died is answered under a later epoch than its first claim:
        whether the sweeper took it back (a `lease_expired` event) or, on a loaded machine, the
        killed task's redelivery claimed the expired lease first (no event)."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                select(messages_table.c.epoch)
                .where(messages_table.c.run_id == run_id, messages_table.c.role == "assistant")
                .order_by(messages_table.c.idx)
            )
            return list(rows.scalars())

    # ------------------------------------------------------------ the invariants

    def assert_invariants(
        self, run_ids: Iterable[str], *, extra_model_calls: int | dict[int, int] = 0, timeout: float = 40
    ) -> dict[str, RunOutput]:
        """What every chaos test checks, for every run:

        1. it reaches COMPLETED or ERROR within `timeout`;
        2. its message indexes are 0..n-1, unique, and match the run's message count;
        3. every tool call has at most one result, answering a call made before it; no call of
           `effect` took effect twice, and every finished one took effect exactly once (one
           ledger row per call);
        4. the model was called at most 1 + injected faults times per step (`extra_model_calls`:
           one number for every step, or per step).
        """
        outputs = self.wait_final(run_ids, timeout=timeout)
        for run_id, out in outputs.items():
            self._assert_messages(run_id)
            self._assert_tool_results(run_id, out.messages)
            for seq, n in self.model_calls(run_id).items():
                extra = extra_model_calls if isinstance(extra_model_calls, int) else extra_model_calls.get(seq, 0)
                assert n <= 1 + extra, f"run {run_id} step {seq}: {n} model calls, at most {1 + extra} expected"
        return outputs

    def _assert_messages(self, run_id: str) -> None:
        with self.store.engine.connect() as conn:
            idx = [r.idx for r in conn.execute(
                select(messages_table.c.idx).where(messages_table.c.run_id == run_id).order_by(messages_table.c.idx)
            )]  # fmt: skip
            count = conn.execute(
                select(func.count()).select_from(messages_table).where(messages_table.c.run_id == run_id)
            ).scalar()
        record = self.store.get_record(run_id)
        assert idx == list(range(len(idx))), f"run {run_id}: message indexes not contiguous: {idx}"
        assert count == len(idx) == record.n_messages, f"run {run_id}: {count} rows, n_messages={record.n_messages}"

    def _assert_tool_results(self, run_id: str, transcript: list[Message]) -> None:
        asked: set[str] = set()
        answered: list[str] = []
        for m in transcript:
            if m.role == "assistant":
                asked |= {c.id for c in m.calls}
            if m.role == "tool":
                assert m.tool_call_id in asked, f"run {run_id}: result for {m.tool_call_id} before its call"
                answered.append(m.tool_call_id or "")
        assert len(answered) == len(set(answered)), f"run {run_id}: a tool call has two results: {answered}"
        done = {m.tool_call_id for m in transcript if m.role == "tool" and m.tool_name in ("effect", "effect_once")
                and not m.tool_call_error}  # fmt: skip
        rows = self.effect_rows(run_id)
        self._assert_no_double_effect(run_id, rows)
        missing = done - {call_id for call_id, _, _ in rows}
        assert not missing, f"run {run_id}: finished calls {missing} left no effect"

    @staticmethod
    def _assert_no_double_effect(run_id: str, rows: list[tuple[str, str, int]]) -> None:
        times = Counter(call_id for call_id, _, _ in rows)
        twice = {
            call_id: [(key, f"pid {pid}") for c, key, pid in rows if c == call_id]
            for call_id, n in times.items() if n > 1
        }  # fmt: skip
        assert not twice, f"run {run_id}: tool calls took effect more than once: {twice}"
