"""MCP tools (`orchestrator.tools.mcp`) against a real MCP server (the `mcp` SDK's `MCPServer`,
`orchestrator.testing.mcp_server`) over streamable HTTP, one server process for the module, and
over stdio where a second tool set is listed; steps run by the in-memory dispatcher. A real
worker, and the server killed mid-batch over both transports: tests/integration/test_mcp_workers.py."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

from orchestrator import Agent, RunStatus
from orchestrator import agent as agent_module
from orchestrator.catalog import CatalogKeeper, entries
from orchestrator.errors import ConfigurationError
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.mcp_server import PIXEL, HTTPServer, free_port, read_log, server_env, stdio_command
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.waiting import wait_until
from orchestrator.tools import ToolContext
from orchestrator.tools.mcp import IDEMPOTENCY_META_KEY, MCPTool, MCPToolError, MCPTools, render
from orchestrator.tools.mcp_session import MCPConnection
from tests.support import Clock, CountingModel

S = RunStatus


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HTTPServer]:
    with HTTPServer(log=tmp_path_factory.mktemp("mcp") / "calls.jsonl") as running:
        yield running


def name() -> str:
    return f"mcp-{uuid.uuid4().hex[:8]}"


def calling(*batches: list[tuple[str, dict[str, Any]]]) -> CountingModel:
    """A model that asks for these batches of calls, then answers with what the tools said."""
    script = [[{"tool": tool, "arguments": args} for tool, args in batch] for batch in batches]
    return CountingModel(script=ScriptConfig(batches=script))


def calls_of(server: HTTPServer, run_id: str) -> list[dict[str, object]]:
    assert server.log is not None
    return [c for c in read_log(server.log) if str(c.get("key", "")).startswith(f"{run_id}:")]


def test_the_servers_tools_are_offered_with_its_input_schemas(server: HTTPServer) -> None:
    tools = MCPTools(url=server.url, transport="streamable-http")
    agent = Agent(name=name(), model=CountingModel(), tools=[tools])

    specs = {s.name: s for s in agent.tool_specs()}
    assert list(specs) == ["add", "echo", "fail", "picture", "hang"]
    assert specs["add"].description == "Add two integers."
    add = specs["add"].parameters
    assert add["type"] == "object" and add["required"] == ["a", "b"]
    assert add["properties"]["a"]["type"] == "integer"

    # A tool the server no longer has (it changed since the listing): the server's error is the
    # call's, and the session is kept for the next call.
    listed = tools.functions["add"]
    assert isinstance(listed, MCPTool)
    gone = MCPTool(tools.connection, listed.server_tool.model_copy(update={"name": "gone"}))
    with pytest.raises(MCPToolError, match="Unknown tool: gone"):
        gone.call({}, ToolContext(run_id="r", tool_call_id="c1"))
    assert listed.call({"a": 1, "b": 1}, ToolContext(run_id="r", tool_call_id="c2")) == "2"


def test_each_call_is_a_tool_call_of_the_batch_with_its_key_in_meta_and_errors_are_the_models_to_read(
    inline: InMemoryDispatcher, server: HTTPServer
) -> None:
    batch: list[tuple[str, dict[str, Any]]] = [
        ("add", {"a": 2, "b": 3}),
        ("echo", {"text": "hi"}),
        ("picture", {}),
        ("fail", {"message": "no disk"}),
    ]
    model = calling([*batch, ("add", {"a": "two", "b": 3})])
    agent = Agent(name=name(), model=model, tools=[MCPTools(url=server.url, transport="streamable-http")])

    out = agent.run("go")

    assert out.status == S.COMPLETED
    results = {m.tool_call_id: m for m in out.messages if m.role == "tool"}
    calls = [c for m in out.messages if m.role == "assistant" for c in m.calls]
    by_name = [(c.name, results[c.id]) for c in calls]
    assert [(n, r.content, r.tool_call_error) for n, r in by_name[:3]] == [
        ("add", "5", False),
        ("echo", f"hi (key {out.run_id}:{calls[1].id})", False),
        ("picture", "a pixel\n[image: image/png, 68 bytes]", False),
    ]
    fail = by_name[3][1]
    assert fail.tool_call_error and "no disk" in (fail.content or "")
    refused = by_name[4][1]  # the server's schema refuses it: never sent
    assert refused.tool_call_error and "a: 'two' is not of type 'integer'" in (refused.content or "")
    seen = calls_of(server, out.run_id)
    assert sorted((c["tool"], c["key"]) for c in seen) == sorted(
        (c.name, f"{out.run_id}:{c.id}") for c in calls[:4]
    )  # each call once, with `ratchet/idempotency_key` in its _meta; the refused one never reached it
    assert IDEMPOTENCY_META_KEY == "ratchet/idempotency_key"


def test_lists_prefix_at_most_once_and_the_pause_flags_apply_to_mcp_tools(
    inline: InMemoryDispatcher, server: HTTPServer
) -> None:
    tools = MCPTools(
        url=server.url,
        transport="streamable-http",
        tool_name_prefix="calc",
        exclude_tools=["hang", "picture"],
        at_most_once_tools=["add"],
        requires_confirmation_tools=["echo"],
        external_execution_required_tools=["fail"],
    )
    model = calling([("calc_echo", {"text": "careful"}), ("calc_fail", {"message": "x"})])
    agent = Agent(name=name(), model=model, tools=[tools])
    assert [t.name for t in agent.tools] == ["calc_add", "calc_echo", "calc_fail"]
    flags = {t.name: (t.at_most_once, t.pause_type) for t in agent.tools}
    assert flags == {
        "calc_add": (True, None),
        "calc_echo": (False, "confirmation"),
        "calc_fail": (False, "external_execution"),
    }

    out = agent.run("go")

    assert out.status == S.PAUSED and calls_of(server, out.run_id) == []
    confirm, external = sorted(out.active_requirements, key=lambda r: r.pause_type)
    confirm.confirm()
    external.set_external_execution_result("done elsewhere")
    done = agent.continue_run(out)

    assert done.status == S.COMPLETED
    assert [c["tool"] for c in calls_of(server, out.run_id)] == ["echo"]  # the external one never reached it
    results = {m.tool_name: m.content for m in done.messages if m.role == "tool"}
    echo_id = confirm.tool_execution.tool_call_id if confirm.tool_execution else None
    assert results == {"calc_echo": f"careful (key {out.run_id}:{echo_id})", "calc_fail": "done elsewhere"}

    with pytest.raises(ConfigurationError, match=r"include_tools names \['nope'\].*it lists \['add', 'echo'"):
        MCPTools(url=server.url, include_tools=["nope"])


def test_an_interrupted_at_most_once_mcp_call_is_not_sent_again(
    inline: InMemoryDispatcher, server: HTTPServer, clock: Clock
) -> None:
    tools = MCPTools(url=server.url, include_tools=["add"], at_most_once_tools=["add"])
    agent = Agent(name=name(), model=calling([("add", {"a": 1, "b": 1})]), tools=[tools])
    inline.autorun = False
    run_id = agent.start("add").run_id
    inline.run_next()  # the model asks for the call
    doomed = inline.store.claim(run_id, 1, "tools", owner="doomed", lease_seconds=30, max_attempts=5)
    assert doomed is not None
    inline.store.record_tool_start(doomed, doomed.messages[-1].calls[0].id, "add")  # started; its worker died
    inline.run_until_idle()
    clock.advance(31)
    assert inline.sweep().requeued == [run_id]
    inline.run_until_idle()

    out = inline.client.get_run(run_id)
    assert out.status == S.ERROR and out.error is not None and out.error.type == "ToolInterruptedError"
    assert calls_of(server, run_id) == []


def test_a_server_that_lists_other_tools_after_a_deploy_is_another_definition_in_the_catalog(
    inline: InMemoryDispatcher, server: HTTPServer
) -> None:
    agent_name, store, settings = name(), inline.store, inline.settings

    def served(tools: MCPTools) -> list[str]:
        """The tools of the agent as a worker that starts with it writes them into the catalog."""
        agent = Agent(name=agent_name, model=CountingModel(), tools=[tools])
        agent_module._registry.pop(agent_name, None)  # the next worker process defines it anew
        agent_module._sites.pop(agent_name, None)
        CatalogKeeper(lambda: store, settings, agents=lambda: [agent]).write()
        latest = entries(store, settings, agent_name)[0].definition
        return [f"{t.name}:{json.dumps(t.parameters['properties'], sort_keys=True)}" for t in latest.tools]

    before = served(MCPTools(url=server.url))
    after = served(
        MCPTools(stdio_command("--tools", "v2"), env=server_env(), timeout_seconds=60)
    )  # its next version, over stdio

    assert [t.split(":")[0] for t in before] == ["add", "echo", "fail", "picture", "hang"]
    assert [t.split(":")[0] for t in after] == ["add", "echo", "fail", "multiply", "hang"]
    assert before[0] == after[0] and '"a": {"title": "A", "type": "integer"}' in after[3]
    assert len(entries(store, settings, agent_name)) == 2  # two definitions, as during a deploy


def test_a_server_that_cannot_be_listed_or_a_missing_sdk_is_a_configuration_error_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    base = f"http://127.0.0.1:{free_port()}"
    url = f"{base}/mcp"  # nothing listens there
    with pytest.raises(
        ConfigurationError, match=f"could not list the tools of the streamable-http server {base}: .*Start"
    ):
        MCPTools(url=url, timeout_seconds=5)
    with pytest.raises(ConfigurationError, match="one of command= .* or url="):
        MCPTools()
    with pytest.raises(ConfigurationError, match="sse transport is not supported"):
        MCPTools(url=url, transport="sse")  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "mcp", None)  # the SDK not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'ratchet-agents\[mcp\]'"):
        MCPTools(url=url)


def test_a_forked_process_opens_its_own_session_and_its_calls_reach_the_server(server: HTTPServer) -> None:
    tools = MCPTools(url=server.url, include_tools=["echo"])
    echo = tools.functions["echo"]
    assert echo.call({"text": "parent"}, ToolContext(run_id="fork", tool_call_id="p")) == "parent (key fork:p)"
    read, write = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns of forking a process with threads: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        child = os.fork()
    if child == 0:  # a pool process: the parent's session is not its own
        try:
            os.write(write, str(echo.call({"text": "child"}, ToolContext(run_id="fork", tool_call_id="c"))).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        assert answer.read() == "child (key fork:c)"
    os.waitpid(child, 0)
    assert echo.call({"text": "again"}, ToolContext(run_id="fork", tool_call_id="q")) == "again (key fork:q)"


def test_content_blocks_are_text_as_they_are_and_others_in_one_line() -> None:
    blob = BlobResourceContents(uri="file:///a.bin", mime_type="application/octet-stream", blob=PIXEL)
    result = CallToolResult(
        content=[
            TextContent(text="first"),
            EmbeddedResource(resource=TextResourceContents(uri="file:///a.txt", text="inside")),
            EmbeddedResource(resource=blob),
            AudioContent(data=PIXEL, mime_type="audio/wav"),
            ResourceLink(uri="file:///b", name="b"),
        ]
    )
    assert render(result).splitlines() == [
        "first",
        "inside",
        "[resource: file:///a.bin, application/octet-stream, 68 bytes]",
        "[audio: audio/wav, 68 bytes]",
        "[resource link: file:///b (b)]",
    ]
    assert render(CallToolResult(content=[], structured_content={"total": 5})) == '{"total": 5}'


def test_a_server_is_named_in_messages_without_the_secrets_of_its_command_or_url() -> None:
    commands = [
        "/opt/bin/srv --api-key sk-live-123 --token=sk-live-123 TOKEN=sk-live-123 --port 8",
        'npx -y mcp-remote https://mcp.example/mcp --header "Authorization: Bearer sk-live-123"',
        "uvx mcp-server-x --bearer sk-live-123",
    ]
    named = [MCPConnection(command=command).server for command in commands]
    assert [n.split(" (")[0] for n in named] == ["stdio server `srv`", "stdio server `npx`", "stdio server `uvx`"]
    assert all(re.fullmatch(r"stdio server `\w+` \(command #[0-9a-f]{8}\)", n) for n in named)
    assert MCPConnection(command=commands[1]).server == named[1]  # the same command, the same name
    assert MCPConnection(command=commands[1].replace("123", "456")).server != named[1]  # another command
    for address in [
        "https://ann:pw@mcp.example.com:8443/mcp?api_key=sk-live-123",
        "https://mcp.example.com:8443/v1/sk-live-123/mcp",
    ]:
        assert MCPConnection(url=address).server == "streamable-http server https://mcp.example.com:8443"
    url = MCPConnection(url="https://ann:pw@mcp.example.com/v1/sk-live-123/mcp?api_key=sk-live-456")
    said = url.reason(RuntimeError(f"401 for url '{url.url}' (sk-live-123)"))
    assert "sk-live" not in said and ":pw@" not in said and said.startswith("RuntimeError: 401 for url")
    command = MCPConnection(command=commands[1], env={"AUTH": "sk-env-1"})
    said = command.reason(OSError(f"{commands[1]}: not found; Bearer sk-live-123; env sk-env-1"))
    assert "sk-live" not in said and "sk-env" not in said and said.startswith("OSError: npx")
    with pytest.raises(ConfigurationError, match="cannot be split into words") as split:
        MCPConnection(command='srv --token "sk-live-123')
    assert "sk-live" not in str(split.value)


def test_a_call_the_server_never_answers_is_a_tool_error_after_timeout_seconds_and_the_next_call_works(
    server: HTTPServer,
) -> None:
    tools = MCPTools(url=server.url, include_tools=["add", "hang"], timeout_seconds=1)
    hang, add = tools.functions["hang"], tools.functions["add"]

    with pytest.raises(MCPToolError, match="did not answer the call of 'hang'.*timed out.*next call opens a new one"):
        hang.call({}, ToolContext(run_id="t", tool_call_id="h"))
    assert add.call({"a": 1, "b": 2}, ToolContext(run_id="t", tool_call_id="a")) == "3"  # through a new session


def test_a_soft_time_limit_while_a_session_opens_ends_the_step_rather_than_becoming_a_tool_error() -> None:
    silent = MCPConnection(command=f"{shlex.quote(sys.executable)} -c 'import time; time.sleep(60)'")

    def soft_limit(*_: object) -> None:  # what Celery's soft time limit does in a worker's main thread
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, soft_limit)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)  # the server never answers: the opening waits
        with pytest.raises(SoftTimeLimitExceeded):
            silent.call("add", {"a": 1, "b": 2}, {})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not silent.connected  # the opening was cancelled: no session is left open


def test_a_stdio_server_that_dies_while_idle_is_started_again_and_sent_the_next_call(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    tools = MCPTools(stdio_command("--log", str(log)), env=server_env(), include_tools=["add"], timeout_seconds=30)
    add = tools.functions["add"]
    assert add.call({"a": 1, "b": 2}, ToolContext(run_id="idle", tool_call_id="a")) == "3"
    serving = [line["serving"] for line in read_log(log) if "serving" in line]  # the listing's, then the call's
    os.kill(serving[-1], signal.SIGKILL)  # dies between calls: nothing is in flight
    wait_until(lambda: not tools.connection.connected, timeout=20, what="the session to the dead server to end")
    assert add.call({"a": 3, "b": 4}, ToolContext(run_id="idle", tool_call_id="b")) == "7"
    lines = read_log(log)
    calls = [(line["key"], line["pid"]) for line in lines if line.get("tool") == "add"]
    started = [line["serving"] for line in lines if "serving" in line]
    assert len(started) == len(serving) + 1  # the next call started the server again
    assert calls == [("idle:a", serving[-1]), ("idle:b", started[-1])]  # and was sent once, to it
