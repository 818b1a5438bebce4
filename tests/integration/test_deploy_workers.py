"""Deploys on real worker subprocesses (`ratchet worker`, threads pool), real Redis and PostgreSQL,
with the versions of tests/integration/deploy_agents.py: a run in flight while its workers are
replaced by a compatible version completes on the new one; replaced by one that changed the tool
it owes a call of, it stops with DefinitionChangedError and goes on after `ratchet continue
--accept-definition`; two versions side by side each run the steps of their own runs; a run
PAUSED across a deploy resumes on the new version. The rules, stepped inline:
tests/unit/test_deploys.py.

Short windows, so that a version whose workers stopped is not live for long: the catalog is
marked every 0.5 s (live for 1.5 s), a step nobody claimed is published again after 2 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from orchestrator import Client, Decision, RunStatus
from orchestrator.catalog import describe, entries
from orchestrator.settings import Settings
from orchestrator.store import forget_stores
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import TEST_KEY, make_settings, settings_env
from tests.integration.deploy_agents import AGENT, DIR, VERSION, define
from workers.celery.app import CONTINUE_TASK, create_app

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.deploy_agents"
S = RunStatus
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]
#: Each version's definition hash, as its workers serve it.
HASHES = {v: describe(define(v)).hash for v in (1, 2, 3)}
#: Short catalog and outbox windows (see the module docstring).
WINDOWS = dict(
    catalog_seen_seconds=0.5, publish_grace_seconds=2.0, sweep_seconds=0.25, lease_seconds=4.0, heartbeat_seconds=1.0
)


@dataclass
class Fleet:
    """Workers of several versions of one agent on one database, and the test's producer."""

    settings: Settings
    dir: Path
    scripted: ScriptedServer
    client: Client = field(init=False)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = Client(self.settings)
        self.client.store  # noqa: B018  (opened: migrated before a worker starts)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
        env.update(settings_env(self.settings), PYTHONPATH=str(ROOT), RATCHET_AUTO_MIGRATE="false", **extra)
        return env

    def start_worker(self, version: int) -> subprocess.Popen[bytes]:
        """A worker of `version` in its own session; returns once it consumes."""
        node = f"v{version}-{uuid.uuid4().hex[:6]}@%h"
        env = self.env(
            OPENAI_BASE_URL=self.scripted.url, OPENAI_API_KEY=TEST_KEY, **{DIR: str(self.dir), VERSION: str(version)}
        )
        argv = [sys.executable, "-m", "workers.cli", "worker", "--app", APP, "-P", "threads", "-c", "2", "-n", node]
        with (self.dir / f"worker-{len(self.workers)}-v{version}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, env=env, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.workers.append(proc)
        ready = f"ready-{node.split('@')[0]}@*"
        wait_until(lambda: list(self.dir.glob(ready)) or proc.poll() is not None, 60, what="the worker to consume")
        assert proc.poll() is None, self.log()
        return proc

    def stop(self, proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        proc.wait(30)

    def stop_all(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.dir.glob("worker-*.log")))

    def ran(self, run_id: str) -> list[tuple[str, int]]:
        """What the tools did for the run: (tool:argument, version) per time one ran."""
        ledger = self.dir / f"{run_id}.ran"
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        return [(what, int(version)) for what, version, _ in (line.split() for line in lines)]

    def hold(self, query: str) -> Path:
        hold = self.dir / f"hold-{query}"
        hold.touch()
        return hold

    def completed(self, run_id: str) -> None:
        wait_until(lambda: self.client.store.get_record(run_id).status == S.COMPLETED, 60, what="the run to complete")

    def running_lookup(self, run_id: str) -> bool:
        record = self.client.store.get_record(run_id)
        return record.status == S.RUNNING and record.next_step == "tools" and any(self.dir.glob("started-otters.*"))

    def live(self, version: int) -> bool:
        found = [e for e in entries(self.client.store, self.settings, AGENT) if e.definition.hash == HASHES[version]]
        return bool(found) and found[0].live

    def steps_on(self, run_id: str) -> list[tuple[str, str, int | None]]:
        """(task, status, version) of each step of the run."""
        version = {h: v for v, h in HASHES.items()}
        steps = self.client.get_steps(run_id)
        return [(s.task, s.status, version.get(s.definition_hash or "")) for s in steps]


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str, redis_url: str, scripted: ScriptedServer) -> Iterator[Fleet]:
    fleet = Fleet(settings=make_settings(pg_url, redis_url, **WINDOWS), dir=tmp_path, scripted=scripted)
    scripted.configure(
        ScriptConfig(batches=[[{"tool": "lookup", "arguments": {"query": "otters"}}]], final_text="{tool_results}")
    )
    try:
        yield fleet
    finally:
        fleet.stop_all()
        forget_stores()


def in_flight_on_version_1(fleet: Fleet, runs: int = 1) -> list[str]:
    """Runs whose lookup calls a worker of version 1 was running when it was killed (SIGKILL: a
    lost node), with nothing else left: their leases expire, and the sweeper queues them again."""
    old = fleet.start_worker(1)
    hold = fleet.hold("otters")
    define(1)  # the producer runs the code of version 1 too
    run_ids = [fleet.client.start(AGENT, input="find otters").run_id for _ in range(runs)]
    wait_until(lambda: all(fleet.running_lookup(r) for r in run_ids), 60, what="every run's lookup call to run")
    fleet.stop(old, signal.SIGKILL)
    hold.unlink()
    return run_ids


def test_a_run_in_flight_while_its_workers_are_replaced_by_a_compatible_version_completes_on_the_new_one(
    fleet: Fleet,
) -> None:
    [run_id] = in_flight_on_version_1(fleet)

    # The old worker is lost mid-call (a worker stopped gracefully finishes its steps first, and
    # takes the run's next ones while it lives); only version 2, of other instructions, is left
    fleet.start_worker(2)

    done = fleet.client.wait(run_id, timeout=60)
    assert done.status == S.COMPLETED, fleet.log()
    assert done.definition_hash == HASHES[2]
    assert fleet.ran(run_id) == [("lookup:otters", 2)]
    assert fleet.steps_on(run_id) == [("model", "done", 1), ("tools", "done", 2), ("model", "done", 2)]
    moved = [e.detail or {} for e in fleet.client.get_log(run_id) if e.kind == "definition"]
    assert [(d["from"], d["to"], d["why"]) for d in moved] == [(HASHES[1], HASHES[2], "unchanged")]


def test_runs_owing_a_call_of_a_tool_the_new_version_changed_stop_and_go_on_once_accepted(fleet: Fleet) -> None:
    by_cli, by_task = in_flight_on_version_1(fleet, runs=2)

    # Only version 3, whose lookup takes a limit too, is left
    fleet.start_worker(3)

    for run_id in (by_cli, by_task):
        stopped = fleet.client.wait(run_id, timeout=60)
        assert stopped.status == S.ERROR and stopped.error is not None, fleet.log()
        assert stopped.error.type == "DefinitionChangedError"
        assert "tool 'lookup'" in stopped.error.message and "its arguments' schema changed" in stopped.error.message
        assert fleet.ran(run_id) == []

    # Accepted from the command line, and by the Celery task any language sends by name
    accept = [sys.executable, "-m", "workers.cli", "continue", by_cli, "--accept-definition", HASHES[3], "--wait"]
    done = subprocess.run(accept, env=fleet.env(), capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    app = create_app(fleet.settings)
    try:
        app.send_task(CONTINUE_TASK, args=[by_task], kwargs={"accept_definition": HASHES[3]})
    finally:
        app.close()

    for run_id in (by_cli, by_task):  # (the task is sent: the run is in ERROR until a worker takes it)
        fleet.completed(run_id)
        assert fleet.client.get_run(run_id).definition_hash == HASHES[3]
        assert fleet.ran(run_id) == [("lookup:otters", 3)]


def test_two_versions_side_by_side_each_run_the_steps_of_their_own_runs(fleet: Fleet) -> None:
    fleet.start_worker(1)
    fleet.start_worker(2)
    started: dict[str, int] = {}
    for version in (1, 2, 1, 2, 1, 2):
        define(version)  # producers of both versions
        started[fleet.client.start(AGENT, input="find otters").run_id] = version

    for run_id, version in started.items():
        done = fleet.client.wait(run_id, timeout=60)
        assert done.status == S.COMPLETED and done.definition_hash == HASHES[version], fleet.log()
        assert fleet.ran(run_id) == [("lookup:otters", version)]
        assert [v for _, _, v in fleet.steps_on(run_id)] == [version] * 3


def test_a_run_paused_across_a_deploy_resumes_on_the_new_version(fleet: Fleet) -> None:
    pay = {"tool": "pay", "arguments": {"amount": 100, "to": "ann"}}
    fleet.scripted.configure(ScriptConfig(batches=[[pay]], final_text="{tool_results}"))
    old = fleet.start_worker(1)
    define(1)
    out = fleet.client.start(AGENT, input="pay ann").wait(timeout=60)
    assert out.status == S.PAUSED, fleet.log()
    [requirement] = out.active_requirements

    fleet.stop(old)
    fleet.start_worker(2)
    wait_until(lambda: not fleet.live(1), 30, what="version 1 to be live no more")
    fleet.client.decide(out.run_id, requirement.id, Decision(kind="confirm"), by="ops")

    done = fleet.client.wait(out.run_id, timeout=60)
    assert done.status == S.COMPLETED and done.definition_hash == HASHES[2], fleet.log()
    assert fleet.ran(out.run_id) == [("pay:ann", 2)]
    # (The batch that paused wrote nothing: no stamp says which worker ran it)
    assert [(task, version) for task, _, version in fleet.steps_on(out.run_id)] == [
        ("model", 1),
        ("tools", None),
        ("decision", None),
        ("tools", 2),
        ("model", 2),
    ]
