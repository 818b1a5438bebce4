"""A member's pause two levels down survives its worker: real `ratchet worker` processes on Redis,
the real openai client talking to the scripted model server, on SQLite and on PostgreSQL.

The team of `tests.integration.hitl_team_agents` runs on a worker until its payer (top -> desk ->
payer) pauses for a confirmation; the worker is killed (SIGKILL, its whole process group) and
another one started; the decision, sent to the top team's run, resumes the payer in place on the
new worker, then the desk's leader and the top's. Everything else about a member's pause (two
members decided one by one, cancels, failures, the sweeper) runs with the in-memory dispatcher in
tests/unit/test_hitl_teams_inline.py; the lock order on PostgreSQL in test_hitl_teams_locks.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator import Agent, Client, Decision, RunStatus, Team
from orchestrator.settings import Settings
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.conftest import settings_env
from tests.integration import hitl_team_agents as crew

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.redis, pytest.mark.slow]
S = RunStatus

Worker = subprocess.Popen[bytes]


@pytest.fixture
def start_worker(settings: Settings, scripted: ScriptedServer, tmp_path: Path) -> Iterator[Callable[[], Worker]]:
    """Start a `ratchet worker` (prefork, one child) in a session of its own on this test's
    queues and database, importing the team; every one still alive is stopped at the end."""
    Client(settings).store  # noqa: B018  (opened: migrated before a worker reads it)
    procs: list[Worker] = []
    environ = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    environ.update(settings_env(settings), PYTHONPATH=str(ROOT), RATCHET_AUTO_MIGRATE="false")
    environ[crew.LEDGER] = str(tmp_path / "ledger")

    def start() -> Worker:
        node = f"hitl-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        argv = [sys.executable, "-m", "workers.cli", "worker", "--app", crew.__name__, "-c", "1", "-n", node]
        with (tmp_path / f"{node.split('@')[0]}.log").open("wb") as log:
            proc = subprocess.Popen(
                [*argv, "-l", "INFO"], env=environ, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # its pid is its process group: one signal reaches its pool too
            )  # fmt: skip
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def to(member: Agent | Team, task: str) -> dict[str, object]:
    return {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": task}}


def test_a_member_paused_two_levels_down_is_decided_after_its_worker_was_killed_and_replaced(
    settings: Settings, scripted: ScriptedServer, start_worker: Callable[[], Worker], tmp_path: Path
) -> None:
    pay = {"tool": "pay", "arguments": {"amount": 5, "to": "ann"}}
    by_model = {
        "top": ScriptConfig(
            batches=[[to(crew.desk, "pay"), to(crew.writer, "note")]], final_text="top: {tool_results}"
        ),
        "desk": ScriptConfig(batches=[[to(crew.payer, "pay ann 5")]], final_text="desk: {tool_results}"),
        "payer": ScriptConfig(batches=[[pay]], final_text="payer: {tool_results}"),
        "writer": ScriptConfig(final_text="writer: {user}"),
    }
    scripted.configure(ScriptConfig(by_model=by_model))
    client = Client(settings)
    first = start_worker()

    # Given the top team PAUSED for its payer, two levels down, its writer done
    run_id = client.start(crew.top.name, input="go").run_id
    out = wait_until(
        lambda: (
            (o := client.get_run(run_id)).status == S.PAUSED
            and all(m.status == S.COMPLETED for m in o.member_runs if m.agent_name == crew.writer.name)
            and o
        ),
        timeout=60,
        what="the top team to pause for its payer, its writer done",
    )
    [req] = out.active_requirements
    [desk] = [m for m in out.member_runs if m.agent_name == crew.desk.name]
    [payer] = desk.member_runs
    assert desk.status == S.PAUSED and payer.status == S.PAUSED
    assert req.member_agent_name == crew.payer.name and req.member_run_id == payer.run_id == req.run_id
    assert not (tmp_path / "ledger").exists()
    assert Counter(r["model"] for r in scripted.requests) == {"top": 1, "desk": 1, "payer": 1, "writer": 1}
    for paused in (run_id, desk.run_id, payer.run_id):  # nothing held while PAUSED
        assert client.store.get_record(paused).lease_owner is None

    # When its worker is killed, another one starts, and the decision is sent to the top team
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    second = start_worker()
    client.decide(run_id, req.id, Decision(kind="confirm"), by="ann")

    # Then the payer resumed in place on the new worker and paid once; each leader was asked once
    # more (its fan-in), the writer not again; the run completed under its run id
    done = client.wait(run_id, timeout=90)
    assert done.status == S.COMPLETED, done.error
    assert done.content == "top: desk: payer: paid 5 to ann; writer: note"
    assert (tmp_path / "ledger").read_text().split() == [str(second.pid)]
    assert Counter(r["model"] for r in scripted.requests) == {"top": 2, "desk": 2, "payer": 2, "writer": 1}
    [after] = [m for m in done.member_runs if m.agent_name == crew.desk.name]
    assert after.run_id == desk.run_id and after.member_runs[0].run_id == payer.run_id
    assert [r.status for r in done.requirements] == ["decided"] and done.requirements[0].decided_by == "ann"
