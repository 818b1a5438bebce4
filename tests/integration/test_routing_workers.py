"""Steps on queues of their own, with real workers: compose.yaml's `worker-gpu` (run as the plain
process compose would start, on a Redis of the test's own) takes the steps routed to the gpu
queue, and a worker of the default queues the rest. The private agent's model answers only the
gpu worker's key, and each tool says which worker ran it, so a step on the wrong worker shows.
A producer without the agents' module routes by the agent catalog the workers wrote at boot."""

from __future__ import annotations

import codecs
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from sqlalchemy import update

from orchestrator import Client, RunStatus
from orchestrator.settings import Settings
from orchestrator.store.tables import agent_catalog
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from tests.conftest import make_settings, settings_env
from tests.integration.broker_watch import BrokerWatch
from tests.integration.test_compose_commands import expand
from tests.servers import RedisServer
from workers.celery.broker import STEP_SEPARATOR

ROOT = Path(__file__).resolve().parents[2]
#: Imported by the workers and one producer only: in this process its agents would have every
#: embedded worker of the session consume the gpu queue (`EmbeddedWorker`).
AGENTS = "tests.integration.routed_agents"
GPU_KEY, DEFAULT_KEY = "sk-gpu-host-key", "sk-default-host-key"
pytestmark = [pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path, scripted: ScriptedServer) -> Iterator[tuple[Settings, dict[str, Path]]]:
    """compose's worker-gpu and a worker of the default queues, on a Redis of the test's own."""
    redis_server = RedisServer(tmp_path / "redis").start()
    # The workers write the catalog when they start, and not again within the test (so a test
    # that clears it sees a producer without one).
    settings = make_settings(f"sqlite:///{tmp_path / 'ratchet.db'}", redis_server.url, catalog_seen_seconds=3600)
    Client(settings).store  # noqa: B018  (opened: migrated before the workers start)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env.update(settings_env(settings), PYTHONPATH=str(ROOT), OPENAI_BASE_URL=scripted.url)
    env.update(RATCHET_APP=AGENTS, RATCHET_AUTO_MIGRATE="false")
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    gpu = [expand(word, env) for word in compose["worker-gpu"]["command"]]
    workers = {
        "gpu": ([str(Path(sys.executable).parent / gpu[0]), *gpu[1:]], GPU_KEY),
        "default": ([sys.executable, "-m", "workers.cli", "worker", "-P", "threads", "-c", "4"], DEFAULT_KEY),
    }
    procs, logs = [], {}
    try:
        for role, (argv, key) in workers.items():
            logs[role] = tmp_path / f"{role}.log"
            with logs[role].open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        argv, env={**env, "WORKER_ROLE": role, "OPENAI_API_KEY": key}, cwd=tmp_path, stdout=out,
                        stderr=subprocess.STDOUT, start_new_session=True,
                    )
                )  # fmt: skip
        yield settings, logs
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        redis_server.stop()


def produce(settings: Settings, logs: dict[str, Path], agent: str, text: str, *args: str) -> str:
    """`ratchet run AGENT TEXT --wait` (with `args`): the id of the run, which completed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env.update(settings_env(settings), PYTHONPATH=str(ROOT), RATCHET_AUTO_MIGRATE="false")
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", agent, text, *args, "--wait", "--timeout", "60"],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr + logs["default"].read_text()[-2000:]
    assert " COMPLETED " in done.stdout
    return done.stdout.split()[0]


def test_steps_of_a_routed_agent_or_tool_run_on_the_worker_of_their_queue(
    cluster: tuple[Settings, dict[str, Path]], scripted: ScriptedServer
) -> None:
    settings, logs = cluster
    lookup = {"tool": "lookup", "arguments": {"query": "cats"}}
    render = {"tool": "render", "arguments": {"scene": "a cat"}}
    scripted.configure(
        ScriptConfig(
            batches=[[lookup], [render, lookup]], by_model={"private-model": ScriptConfig(accept_keys=[GPU_KEY])}
        )
    )

    # A batch that calls `render` went to the gpu worker, the other calls included; the rest did not
    tools = Client(settings).get_run(produce(settings, logs, "routed-tools", "draw a cat", "--app", AGENTS))
    results = [t.result for t in tools.tools]
    # The second batch's two calls run at once and each result is committed as it finishes: in either order
    assert results[0] == "found cats on default"
    assert sorted(results[1:]) == ["found cats on gpu", "rendered a cat on gpu"]

    # A producer without the agents' module (no --app) routes by the catalog: every step of the
    # private agent ran on the gpu worker (its model answers only that worker's key), and the
    # default worker never took one
    private = Client(settings).get_run(produce(settings, logs, "private-agent", "hello"))
    assert private.status == RunStatus.COMPLETED
    assert [t.result for t in private.tools] == ["found hello on gpu"]
    assert f"model_call[{private.run_id}.0.model." not in logs["default"].read_text()

    # Without a live definition (the workers served it long ago, by the catalog) it cannot route
    # the first step: the default worker sends it on
    with Client(settings).store.engine.begin() as conn:
        conn.execute(update(agent_catalog).values(last_seen=0))
    again = Client(settings).get_run(produce(settings, logs, "private-agent", "hello again"))
    assert [t.result for t in again.tools] == ["found hello again on gpu"]
    assert f"model_call[{again.run_id}.0.model." in logs["default"].read_text()  # taken there, sent on

    # The default worker said at start which queue its agents use that it leaves to others
    assert "route steps to queue(s) gpu, which it does not consume" in logs["default"].read_text()


def pushed(watch: BrokerWatch) -> list[tuple[str, str]]:
    """(queue, task id) of every task message pushed onto a queue (onto one of its priority
    lists), in order (MONITOR's lines escape the list's name and the message as C strings do)."""
    found = []
    for line in watch.commands:
        match = re.search(rb'"LPUSH" "([^"]*)" "(.*)"$', line)
        if match is not None:
            message = json.loads(codecs.escape_decode(match.group(2))[0])
            task = message.get("headers", {}).get("id") if isinstance(message, dict) else None
            if task is None:  # not a task message: a reply, or another test's on the same server
                continue
            queue = codecs.escape_decode(match.group(1))[0].decode().split(STEP_SEPARATOR)[0]
            found.append((queue, task))
    return found


def test_a_producer_that_never_imported_a_routed_team_starts_it_with_one_broker_hop(
    cluster: tuple[Settings, dict[str, Path]], scripted: ScriptedServer
) -> None:
    settings, logs = cluster
    delegate = {"tool": "delegate_task_to_member", "arguments": {"member_id": "private-agent", "task": "look"}}
    scripted.configure(
        ScriptConfig(
            by_model={
                "team-model": ScriptConfig(accept_keys=[GPU_KEY], batches=[[delegate]]),
                "private-model": ScriptConfig(accept_keys=[GPU_KEY]),
            }
        )
    )
    # Given both workers wrote the team into the catalog at boot
    store = Client(settings).store
    deadline = time.monotonic() + 60
    while not store.catalog.read("routed-team"):
        assert time.monotonic() < deadline, logs["gpu"].read_text()[-2000:]
        time.sleep(0.1)
    [served] = store.catalog.read("routed-team")
    watch = BrokerWatch(urlsplit(settings.broker_url).port or 6379).start()
    try:
        # When a producer without the team's module starts it
        team = Client(settings).get_run(produce(settings, logs, "routed-team", "look around"))
    finally:
        watch.stop()

    # Then its first step was published once, to the gpu queue, and the row says "team" from the
    # start, with the definition hash the workers serve
    assert team.status == RunStatus.COMPLETED
    first = [(queue, task) for queue, task in pushed(watch) if task.startswith(f"{team.run_id}.0.model.")]
    assert [queue for queue, _ in first] == ["gpu"], first
    assert f"model_call[{team.run_id}.0.model." not in logs["default"].read_text()
    record = store.get_record(team.run_id)
    assert record.kind == "team"
    assert record.definition_hash == served.definition_hash == team.definition_hash
    [member] = team.member_runs
    assert member.definition_hash == store.catalog.read("private-agent")[0].definition_hash
