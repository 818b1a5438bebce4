"""What the team crash tests add to the chaos harness: workers that also know the team."""

from __future__ import annotations

import subprocess
import sys
import uuid
from typing import Any

from orchestrator.messages import ToolCall
from orchestrator.team import TO_MEMBER
from orchestrator.testing.waiting import wait_until
from tests.chaos.harness import WORKER_FLAGS, Cluster, Worker

TEAM_APPS = ("tests.chaos.agents", "tests.chaos.team_agents")


def start_team_worker(cluster: Cluster, *, concurrency: int = 2) -> Worker:
    """`Cluster.start_worker`, with the team module imported too; returns once it consumes."""
    name = f"t{len(cluster.workers) + 1}-{uuid.uuid4().hex[:4]}@chaos"
    log = cluster.root / f"{name.split('@')[0]}.log"
    argv = [sys.executable, "-m", "workers.cli", "worker", "-P", "prefork", "-c", str(concurrency), "-n", name]
    argv += ["-l", "INFO", *WORKER_FLAGS]
    for app in TEAM_APPS:
        argv += ["--app", app]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=cluster.env(), cwd=cluster.root, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its pid is its process group: one signal reaches the pool too
        )  # fmt: skip
    worker = Worker(name, proc, log)
    cluster.workers.append(worker)
    wait_until(
        lambda: (cluster.dir / f"ready-{name}").exists() or not worker.alive(), timeout=30, what=f"worker {name}"
    )
    assert worker.alive(), f"worker {name} died at start:\n{worker.log()[-3000:]}"
    return worker


def delegate(member: str, task: str) -> dict[str, Any]:
    """A scripted leader's call of delegate_task_to_member."""
    return {"tool": TO_MEMBER, "arguments": {"member_id": member, "task": task}}


def delegation_calls(cluster: Cluster, team_run_id: str) -> list[ToolCall]:
    """The delegation calls of the team's first tool batch."""
    messages = cluster.store.get_messages(team_run_id)
    first = next(m for m in messages if m.role == "assistant" and m.tool_calls)
    return [c for c in first.calls if c.name == TO_MEMBER]
