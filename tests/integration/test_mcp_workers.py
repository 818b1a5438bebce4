"""MCP tools from a real Celery worker (threads pool, real Redis; SQLite for one, PostgreSQL for the other), against a
real MCP server process built with the `mcp` SDK (`orchestrator.testing.mcp_server`), over stdio
and over streamable HTTP (uvicorn), the model the scripted OpenAI server: the server's tools in
the catalog the worker writes at boot; the server killed while a call of a batch is in flight,
that call a tool error the model reads, the batch's other call committed and not sent again, and
the session opened anew for the next call. The rules stepped inline, on one server:
tests/unit/test_mcp_inline.py."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from orchestrator import Agent, Client, RunStatus
from orchestrator import agent as agent_module
from orchestrator.catalog import entries
from orchestrator.models import OpenAIChat
from orchestrator.run import RunOutput
from orchestrator.settings import Settings
from orchestrator.testing.mcp_server import HTTPServer, read_log, server_env, stdio_command
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from orchestrator.tools.mcp import MCPTools
from workers.celery.embedded import EmbeddedWorker

S = RunStatus
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(240)]

ECHO = {"tool": "echo", "arguments": {"text": "first"}}
HANG = {"tool": "hang", "arguments": {}}
ADD = {"tool": "add", "arguments": {"a": 2, "b": 3}}


def defined(tools: MCPTools, model_id: str) -> Agent:
    return Agent(name=f"mcp-{uuid.uuid4().hex[:8]}", model=OpenAIChat(id=model_id), tools=[tools])


def forget(*agents: Agent) -> None:
    for agent in agents:
        agent_module._registry.pop(agent.name, None)
        agent_module._sites.pop(agent.name, None)


def when_hanging(client: Client, log: Path, run_id: str) -> int:
    """Wait until the run's `echo` result is committed and the server took its `hang` call: the
    pid of the server serving it."""
    wait_until(
        lambda: any(m.tool_name == "echo" for m in client.get_run(run_id).messages),
        timeout=60,
        what="the echo result to be committed",
    )
    call = wait_until(
        lambda: next((c for c in read_log(log) if c.get("tool") == "hang" and run_id in str(c["key"])), None),
        timeout=60,
        what="the hang call to reach the server",
    )
    return int(call["pid"])


def results(out: RunOutput) -> dict[str, tuple[str, bool]]:
    return {m.tool_name or "": (m.content or "", m.tool_call_error) for m in out.messages if m.role == "tool"}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # one database each: the MCP side is the same
def test_over_stdio_the_catalog_has_the_servers_tools_and_a_killed_server_is_a_tool_error_then_reopened(
    settings: Settings, scripted: ScriptedServer, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    tools = MCPTools(stdio_command("--log", str(log)), env=server_env(), timeout_seconds=60)
    agent = defined(tools, "mcp-stdio")
    scripted.configure(ScriptConfig(batches=[[ECHO, HANG], [ADD]]))
    client = Client(settings)
    try:
        with EmbeddedWorker(settings):
            [entry] = entries(client.store, settings, agent.name)  # written when the worker started
            described = {t.name: t.parameters for t in entry.definition.tools}
            assert list(described) == ["add", "echo", "fail", "picture", "hang"]
            assert described["echo"]["properties"]["text"]["type"] == "string"

            run = client.start(agent.name, input="go")
            os.kill(
                when_hanging(client, log, run.run_id), signal.SIGKILL
            )  # mid-batch: `echo` answered, `hang` in flight
            out = run.wait(timeout=120)
    finally:
        forget(agent)

    assert out.status == S.COMPLETED, out.error
    got = results(out)
    assert got["echo"][0].startswith("first (key ") and got["echo"][1] is False
    assert got["hang"][1] is True and "did not answer the call of 'hang'" in got["hang"][0]
    assert got["add"] == ("5", False)  # through a new session, to a new server process
    served = read_log(log)
    pids = [line["serving"] for line in served if "serving" in line]
    assert len(pids) == 3  # the listing's, the first session's (killed), the new session's
    calls = [(c["tool"], c["pid"]) for c in served if "tool" in c]
    assert sorted(calls) == sorted([("echo", pids[1]), ("hang", pids[1]), ("add", pids[2])])  # each sent once


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_over_streamable_http_a_killed_server_is_a_tool_error_and_the_next_run_reopens_the_session(
    settings: Settings, scripted: ScriptedServer, tmp_path: Path
) -> None:
    log = tmp_path / "calls.jsonl"
    server = HTTPServer(log=log).start()
    try:
        tools = MCPTools(url=server.url, transport="streamable-http", timeout_seconds=60)
        killed, after = defined(tools, "mcp-killed"), defined(tools, "mcp-after")  # one server, one session
        scripted.configure(ScriptConfig(by_model={"mcp-killed": ScriptConfig(batches=[[ECHO, HANG]]),
                                                  "mcp-after": ScriptConfig(batches=[[ADD]])}))  # fmt: skip
        client = Client(settings)
        with EmbeddedWorker(settings):
            run = client.start(killed.name, input="go")
            when_hanging(client, log, run.run_id)
            server.kill()
            first = run.wait(timeout=120)
            down = client.start(after.name, input="again").wait(timeout=120)  # the server is down
            server.start()  # on the same port
            second = client.start(after.name, input="again").wait(timeout=120)
    finally:
        server.kill()
        forget(killed, after)

    assert first.status == S.COMPLETED and results(first)["echo"][1] is False
    hang = results(first)["hang"]
    assert hang[1] is True and "'hang'" in hang[0] and "next call opens a new one" in hang[0]
    assert down.status == S.COMPLETED
    assert results(down)["add"][1] is True and "is unavailable" in results(down)["add"][0]
    assert second.status == S.COMPLETED and results(second)["add"] == ("5", False)
    calls = [c["tool"] for c in read_log(log) if "tool" in c]
    assert sorted(calls) == ["add", "echo", "hang"]  # the call to the server that was down never reached one
