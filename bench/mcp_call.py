"""#26 point 6: what an MCP tool call costs through Ratchet's `MCPTools`, against the same call
made with the `mcp` client directly.

One MCP server (`orchestrator.testing.mcp_server`) over stdio, two sessions to it: the process's
session of an `MCPTools` toolkit, and a `ClientSession` of the SDK's opened by hand on a loop of
its own. A Ratchet round makes `calls` calls of `add` the way a tool step does, from a worker
thread: `parse_arguments` on the model's argument text (checked against the server's schema),
then `call` with a `ToolContext` (the idempotency key put in `_meta`, the request sent through the
process's tool loop, the result's content rendered as text). The floor is the same call made with
the SDK directly by a caller in a thread, as a worker's tool runs: `session.call_tool("add", {...},
meta=...)` through anyio's blocking portal into the session's loop, with the same `_meta`. A third
round awaits the calls inside that loop, timed there (no thread hop, no argument check, no
rendering), shown beside them (`mcp_call_in_loop_ratio`). Interleaved; the ratio is the median of
the paired ratios of the time per call against the floor. The call path only, not a whole run: a
step's commit is measured by `overhead`.
"""

from __future__ import annotations

import functools
import json
import shlex
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from anyio.from_thread import start_blocking_portal

from bench.stats import Row, Section, interleave, median, paired_ratios
from orchestrator.testing.mcp_server import server_env, stdio_command
from orchestrator.tools import ToolContext
from orchestrator.tools.mcp import MCPTools

TARGET = 1.2
ARGS = {"a": 2, "b": 3}


def measure(*, rounds: int, calls: int, warmup: int = 1) -> Section:
    toolkit = MCPTools(stdio_command(), env=server_env(), include_tools=["add"], timeout_seconds=60)
    tool = toolkit.functions["add"]
    raw = json.dumps(ARGS)

    def ratchet_round() -> float:
        t0 = time.perf_counter()
        for i in range(calls):
            context = ToolContext(run_id="bench-mcp", tool_call_id=f"call-{i}")
            assert tool.call(tool.parse_arguments(raw), context) == "5"
        return (time.perf_counter() - t0) * 1000 / calls

    with start_blocking_portal() as portal, portal.wrap_async_context_manager(direct_session()) as session:

        def direct_round() -> float:
            return float(portal.call(timed_calls, session, calls))

        def threaded_round() -> float:
            t0 = time.perf_counter()
            for i in range(calls):
                meta = {"ratchet/idempotency_key": f"bench-mcp:call-{i}"}
                result = portal.call(functools.partial(session.call_tool, "add", ARGS, meta=meta))
                assert result.content[0].text == "5"
            return (time.perf_counter() - t0) * 1000 / calls

        for _ in range(warmup):  # the sessions opened, the first calls' imports paid
            ratchet_round(), direct_round(), threaded_round()
        ratchet, floor, in_loop = interleave(rounds, ratchet_round, threaded_round, direct_round)
    return _section(ratchet, floor, in_loop, calls)


@asynccontextmanager
async def direct_session() -> AsyncIterator[Any]:
    """A session of the SDK's own to another process of the same server (one task holds it open)."""
    from mcp import ClientSession, StdioServerParameters, stdio_client

    command, *args = shlex.split(stdio_command())
    params = StdioServerParameters(command=command, args=args, env=server_env())
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def timed_calls(session: Any, calls: int) -> float:
    """`calls` calls of `add` awaited in the loop, in milliseconds a call."""
    t0 = time.perf_counter()
    for _ in range(calls):
        result = await session.call_tool("add", ARGS)
        assert result.content[0].text == "5"
    return (time.perf_counter() - t0) * 1000 / calls


def _section(ratchet: list[float], floor: list[float], in_loop: list[float], calls: int) -> Section:
    ratio = median(paired_ratios(ratchet, floor))
    setup = f"stdio server, {calls} sequential calls a round"
    rows = [
        Row("The SDK in its own loop: ClientSession.call_tool awaited there", setup, in_loop, "ms", digits=3),
        Row("Floor: the same call from a thread, through anyio's blocking portal, _meta included", setup, floor,
            "ms", digits=3),
        Row("Ratchet: MCPTool.parse_arguments + call, from a thread", setup, ratchet, "ms",
            ratio=ratio, ratio_note="vs floor", target=f"≤ {TARGET}x", met=ratio <= TARGET, digits=3),
    ]  # fmt: skip
    section = Section("An MCP tool call", rows=rows)
    section.numbers["mcp_call_ratio"] = ratio
    section.numbers["mcp_call_in_loop_ratio"] = median(paired_ratios(ratchet, in_loop))
    section.numbers["mcp_call_ms"] = median(ratchet)
    section.numbers["mcp_call_floor_ms"] = median(floor)
    return section
