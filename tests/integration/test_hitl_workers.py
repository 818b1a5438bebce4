"""A person in the loop on real Celery worker subprocesses (`ratchet worker`, threads pool), real
Redis, and PostgreSQL and SQLite: three approvals of one batch decided one by one from two
producer processes, the run PAUSED until the last, each call run once; a rejected call whose note
the model reads; the approval of a run whose worker was killed after it paused, run by the worker
that replaced it. While PAUSED the run holds nothing: no lease, no task in the broker. The same
rules, stepped inline: tests/unit/test_hitl_inline.py and test_hitl_events.py.

The workers of one database serve every test of this module but the one that kills its worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Client, Decision, RunStatus
from orchestrator.run import RunOutput
from orchestrator.settings import Settings
from orchestrator.store import forget_stores
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import TEST_KEY, make_settings, settings_env
from tests.integration.hitl_worker_agents import AGENT, DIR
from tests.isolation import BrokerLeftovers, PgDatabases

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.hitl_worker_agents"
S = RunStatus
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

#: A producer process: it reads one decision a line (JSON) and answers with the requirement as
#: stored and its run's status, or the error, as `Client.decide` gave them.
PRODUCER = """
import json, sys
from orchestrator import Client, Decision
from orchestrator.errors import RatchetError
client = Client()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    ask = json.loads(line)
    try:
        req = client.decide(ask["run_id"], ask["requirement"], Decision.from_json(ask["decision"]), by=ask["by"])
        status = client.store.get_record(ask["run_id"]).status
        print(json.dumps({"decided_by": req.decided_by, "status": status.value}), flush=True)
    except RatchetError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
"""


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env.update(settings_env(settings), PYTHONPATH=str(ROOT), RATCHET_AUTO_MIGRATE="false", **extra)
    return env


@dataclass
class Fleet:
    """Workers of one database, the test's producer, and where the tool writes what it paid."""

    settings: Settings
    dir: Path
    scripted: ScriptedServer
    client: Client = field(init=False)
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = Client(self.settings)
        self.client.store  # noqa: B018  (opened: migrated before a worker starts)

    def start_worker(self) -> subprocess.Popen[bytes]:
        """A `ratchet worker` subprocess in its own session; returns once it consumes."""
        node = f"hitl-{uuid.uuid4().hex[:6]}@%h"
        env = child_env(
            self.settings, OPENAI_BASE_URL=self.scripted.url, OPENAI_API_KEY=TEST_KEY, **{DIR: str(self.dir)}
        )
        argv = [sys.executable, "-m", "workers.cli", "worker", "--app", APP, "-P", "threads", "-c", "4", "-n", node]
        with (self.dir / f"worker-{len(self.workers)}.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, env=env, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.workers.append(proc)
        wait_until(lambda: list(self.dir.glob(f"ready-{node.split('@')[0]}@*")) or proc.poll() is not None, 60,
                   what="the worker to consume")  # fmt: skip
        assert proc.poll() is None, self.log()
        return proc

    def stop(self) -> None:
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

    def paused_run(self, *payees: str) -> RunOutput:
        """A run of `pay` once per payee in one batch, waited for until it PAUSED."""
        calls = [{"tool": "pay", "arguments": {"amount": 100 + i, "to": to}} for i, to in enumerate(payees)]
        self.scripted.configure(ScriptConfig(batches=[calls], final_text="Summary: {tool_results}"))
        out = self.client.start(AGENT, input=f"pay {', '.join(payees)}").wait(timeout=60)
        assert out.status == S.PAUSED, (out.status, out.error, self.log())
        assert len(out.active_requirements) == len(payees)
        return out

    def paid(self, run_id: str) -> list[list[str]]:
        """What `pay` did for the run: [amount, payee, pid] per time it ran."""
        ledger = self.dir / f"{run_id}.paid"
        return [line.split() for line in ledger.read_text().splitlines()] if ledger.exists() else []


class Producer:
    """Another process deciding through its own `Client` (`PRODUCER`)."""

    def __init__(self, settings: Settings, name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PRODUCER], env=child_env(settings), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert json.loads(self._line()) == {"ready": True}

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"producer {self.name} exited with {self.proc.wait(10)}"
        return line

    def decide(self, run_id: str, requirement: str, decision: Decision) -> dict[str, Any]:
        assert self.proc.stdin is not None
        ask = {"run_id": run_id, "requirement": requirement, "decision": decision.to_json(), "by": self.name}
        self.proc.stdin.write(json.dumps(ask) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())  # type: ignore[no-any-return]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str,
    scripted_server: ScriptedServer,
) -> Iterator[Fleet]:  # fmt: skip
    """One worker of this module's own queues on a database of its own, for every test here."""
    folder = tmp_path_factory.mktemp(f"hitl-{request.param}")
    drop = None
    if request.param == "sqlite":
        url = f"sqlite:///{folder / 'ratchet.db'}"
    else:
        databases: PgDatabases = request.getfixturevalue("pg_databases")
        url, drop = databases.create()
    settings = make_settings(url, redis_url)
    fleet = Fleet(settings=settings, dir=folder, scripted=scripted_server)
    try:
        fleet.start_worker()
        yield fleet
    finally:
        fleet.stop()
        BrokerLeftovers(redis_url).delete([settings.model_queue.split(".")[1]])  # its queues' tag
        forget_stores()
        if drop is not None:
            drop()


@pytest.fixture
def producers(fleet: Fleet) -> Iterator[tuple[Producer, Producer]]:
    pair = (Producer(fleet.settings, "producer-a"), Producer(fleet.settings, "producer-b"))
    yield pair
    for producer in pair:
        producer.close()


def test_three_approvals_of_one_batch_decided_one_by_one_from_two_producer_processes(
    fleet: Fleet, producers: tuple[Producer, Producer]
) -> None:
    a, b = producers
    out = fleet.paused_run("ann", "bob", "cy")
    run_id = out.run_id
    first, second, third = out.active_requirements

    # While PAUSED the run holds nothing: no lease, no task in the broker, nothing paid yet
    record = fleet.client.store.get_record(run_id)
    assert record.lease_owner is None and record.lease_expires_at is None
    queues = fleet.client.metrics().queues
    assert queues and not any(queues.values()), queues
    assert fleet.paid(run_id) == []

    # One decision at a time, from either process: PAUSED until the last one
    assert a.decide(run_id, first.id, Decision(kind="confirm")) == {"decided_by": "producer-a", "status": "PAUSED"}
    assert b.decide(run_id, second.id, Decision(kind="confirm")) == {"decided_by": "producer-b", "status": "PAUSED"}
    # The same decision again is a no-op; another one is refused and says who decided first
    assert b.decide(run_id, first.id, Decision(kind="confirm")) == {"decided_by": "producer-a", "status": "PAUSED"}
    refused = b.decide(run_id, first.id, Decision(kind="reject"))
    assert refused["error"] == "DecisionConflictError" and "by producer-a" in refused["message"]
    assert fleet.paid(run_id) == []
    assert a.decide(run_id, third.id, Decision(kind="confirm"))["decided_by"] == "producer-a"

    done = fleet.client.wait(run_id, timeout=60)
    assert done.status == S.COMPLETED and done.run_id == run_id, fleet.log()
    assert sorted(p[:2] for p in fleet.paid(run_id)) == [["100", "ann"], ["101", "bob"], ["102", "cy"]]
    assert [r.decided_by for r in done.requirements] == ["producer-a", "producer-b", "producer-a"]

    # Its events tell the same: the pause with the three calls, the decisions in order, the resume
    events = [e for e in fleet.client.stream(run_id) if e.event != "RunContent"]
    kinds = [e.event for e in events]
    paused = events[kinds.index("RunPaused")]
    assert paused.requirements is not None and [r.id for r in paused.requirements] == [first.id, second.id, third.id]
    decided = [e.requirement for e in events if e.event == "RunRequirementDecided"]
    assert [(r.id, r.decided_by) for r in decided if r] == [
        (first.id, "producer-a"), (second.id, "producer-b"), (third.id, "producer-a"),
    ]  # fmt: skip
    assert kinds[kinds.index("RunPaused") :] == [
        "RunPaused", *["RunRequirementDecided"] * 3, "RunContinued", *["ToolCallCompleted"] * 3, "RunCompleted",
    ]  # fmt: skip
    [wait] = [s for s in fleet.client.get_steps(run_id) if s.task == "decision"]
    assert [d.by for d in wait.decisions] == ["producer-a", "producer-b", "producer-a"] and wait.status == "done"


def test_a_rejected_call_is_not_run_and_the_model_reads_the_note_as_its_result(fleet: Fleet) -> None:
    out = fleet.paused_run("mallory")
    [req] = out.active_requirements
    req.reject(note="over the limit: ask finance first")

    fleet.client.decide(out.run_id, req.id, req, by="finance")
    done = fleet.client.wait(out.run_id, timeout=60)

    assert done.status == S.COMPLETED, fleet.log()
    assert fleet.paid(out.run_id) == []
    [result] = [m for m in done.messages if m.role == "tool"]
    assert result.tool_call_error and result.content == "over the limit: ask finance first"
    assert done.content == "Summary: over the limit: ask finance first"  # the model's next turn read it
    assert len(fleet.scripted.requests_for(out.run_id)) == 2  # the call that paused, the one after


@pytest.fixture
def own_fleet(settings: Settings, tmp_path: Path, scripted: ScriptedServer) -> Iterator[Fleet]:
    """Workers of this test's own (it kills one)."""
    fleet = Fleet(settings=settings, dir=tmp_path, scripted=scripted)
    yield fleet
    fleet.stop()


def test_an_approval_after_the_worker_that_paused_the_run_was_killed_runs_on_its_replacement(
    own_fleet: Fleet,
) -> None:
    fleet = own_fleet
    first = fleet.start_worker()
    out = fleet.paused_run("dora")
    [req] = out.active_requirements

    # The worker that paused the run dies (SIGKILL, as a lost node); another one starts
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    second = fleet.start_worker()
    assert fleet.client.store.get_record(out.run_id).status == S.PAUSED

    fleet.client.decide(out.run_id, req.id, Decision(kind="confirm"), by="ops")
    done = fleet.client.wait(out.run_id, timeout=60)

    assert done.status == S.COMPLETED and done.run_id == out.run_id, fleet.log()
    assert fleet.paid(out.run_id) == [["100", "dora", str(second.pid)]]  # once, on the new worker
