"""`ratchet run --stream` and `ratchet stream`, run as subprocesses against a real worker on Redis:
events printed as they happen (text deltas inline), JSON lines with --json, resumed with --after,
and the exit status of `ratchet show`.

The agents are defined in this process, after its worker started: each is written into the agent
catalog as a worker that serves it writes it at boot, so that `ratchet run`, which does not import
it, knows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from orchestrator import Agent, Client
from orchestrator.catalog import write_served
from orchestrator.settings import Settings
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.conftest import settings_env
from workers.redis.delta_sink import KEY

ROOT = Path(__file__).resolve().parents[2]
ANSWER = "Otters hold hands while they sleep"


def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def ratchet(settings: Settings, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **settings_env(settings), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *argv], env=env, capture_output=True, text=True, timeout=60
    )


def served(settings: Settings, agent: Agent) -> str:
    """The agent's name, once it is in the catalog as a worker that serves it writes it."""
    write_served(Client(settings).store, [agent])
    return agent.name


@pytest.fixture
def agent_name(settings: Settings) -> str:
    config = ScriptConfig(batches=[[{"tool": "lookup", "arguments": {"q": "otters"}}]], final_text=ANSWER)
    agent = Agent(name=f"cli-ev-{uuid.uuid4().hex[:6]}", model=ScriptedModel(script=config), tools=[lookup])
    return served(settings, agent)


@pytest.mark.usefixtures("worker")
def test_run_with_stream_prints_the_runs_events_with_its_text_inline_and_stream_resumes_after_an_id(
    settings: Settings, agent_name: str, redis_url: str
) -> None:
    done = ratchet(settings, "run", agent_name, "otters?", "--stream", "--timeout", "30")
    run_id = done.stdout.splitlines()[0]
    try:
        assert done.returncode == 0, done.stderr
        printed = done.stdout
        assert "RunStarted" in printed and 'ToolCallStarted  lookup({"q": "otters"})' in printed
        assert "ToolCallCompleted  lookup" in printed and "-> found otters" in printed
        assert f"\n{ANSWER}\n" in printed  # the deltas, run together on their own line
        assert printed.rstrip().splitlines()[-1].endswith(f"RunCompleted  {ANSWER}")

        as_json = ratchet(settings, "stream", run_id, "--json")
        assert as_json.returncode == 0, as_json.stderr
        events = [json.loads(line) for line in as_json.stdout.splitlines()]
        assert events[0]["event"] == "RunStarted" and events[-1]["event"] == "RunCompleted"
        assert "".join(e["content"] for e in events if e["event"] == "RunContent") == ANSWER
        assert all(e["run_id"] == run_id for e in events)

        rest = ratchet(settings, "stream", run_id, "--json", "--after", events[2]["id"])
        assert [json.loads(line) for line in rest.stdout.splitlines()] == events[3:]
    finally:
        redis.Redis.from_url(redis_url).delete(KEY.format(run_id=run_id))


@pytest.mark.usefixtures("worker")
def test_stream_of_a_run_that_failed_prints_its_error_and_exits_nonzero_and_a_bad_id_exits_2(
    settings: Settings,
) -> None:
    faulty = ScriptedModel(script=ScriptConfig(faults=[Fault(status=400, times=None)]))
    name = served(settings, Agent(name=f"cli-ev-{uuid.uuid4().hex[:6]}", model=faulty))
    # With --json, `run --stream` prints only events, one a line, as `stream --json` does
    started = ratchet(settings, "run", name, "hello", "--stream", "--timeout", "30", "--json")
    assert started.returncode == 1, started.stderr
    events = [json.loads(line) for line in started.stdout.splitlines()]
    assert events[0]["event"] == "RunStarted" and events[-1]["event"] == "RunError"
    run_id = events[0]["run_id"]

    done = ratchet(settings, "stream", run_id)

    assert done.returncode == 1
    assert done.stdout.splitlines()[-1].split("  ")[0].endswith("RunError")
    as_json = ratchet(settings, "stream", run_id, "--json")
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == events
    bad = ratchet(settings, "stream", run_id, "--after", "not-an-id")
    assert bad.returncode == 2 and "event id 'not-an-id'" in bad.stderr
