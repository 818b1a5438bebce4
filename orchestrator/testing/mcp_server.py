"""A real MCP server for tests, examples and benchmarks, built with the official `mcp` SDK's
`MCPServer`, served over stdio or streamable HTTP (uvicorn).

    python -m orchestrator.testing.mcp_server                       # stdio
    python -m orchestrator.testing.mcp_server --transport streamable-http --port 8765
    python -m orchestrator.testing.mcp_server --tools v2 --log calls.jsonl

Its tools: `add(a, b)`, `echo(text)` (answers the text and the idempotency key the request's
`_meta` carried), `fail(message)` (a result flagged `isError`), `picture()` (a text block and an
image block), `hang()` (never answers: a call in flight when the server is killed). `--tools v2`
adds `multiply(a, b)` and drops `picture`: a server that lists other tools after a deploy.
With `--log FILE` each call appends a JSON line `{"tool", "key", "pid"}` (and the server a
`{"serving": pid}` line when it starts), which a test reads to see what reached the server.

`stdio_command()` and `server_env()` give what `MCPTools(command=..., env=...)` needs to run it;
`HTTPServer` runs it over streamable HTTP on a free port, and kills or restarts it.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent

from orchestrator.testing.waiting import wait_until

IDEMPOTENCY_META_KEY = "ratchet/idempotency_key"
#: A 1x1 PNG, for a content block that is not text.
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mNkYAAAAAYAAjCB0C8AAAAASUVORK5CYII="


def build(tools: str = "v1", log: Path | None = None) -> MCPServer[Any]:
    """The server (an `MCPServer`) with the tools of version `tools`."""
    server = MCPServer(name="ratchet-test", log_level="WARNING")

    def record(tool: str, ctx: Context | None) -> str | None:
        meta = ctx.request_context.meta if ctx is not None else None
        key = meta.get(IDEMPOTENCY_META_KEY) if meta else None
        if log is not None:
            with log.open("a") as f:
                f.write(json.dumps({"tool": tool, "key": key, "pid": os.getpid()}) + "\n")
        return key if isinstance(key, str) else None

    @server.tool()
    def add(a: int, b: int, ctx: Context) -> int:
        """Add two integers."""
        record("add", ctx)
        return a + b

    @server.tool()
    def echo(text: str, ctx: Context) -> str:
        """Echo the text, with the idempotency key the call carried."""
        key = record("echo", ctx)
        return f"{text} (key {key})"

    @server.tool()
    def fail(message: str, ctx: Context) -> str:
        """Fail with the message."""
        record("fail", ctx)
        raise ToolError(message)

    if tools != "v2":

        @server.tool()
        def picture(ctx: Context) -> list[TextContent | ImageContent]:
            """A picture and its caption."""
            record("picture", ctx)
            return [TextContent(text="a pixel"), ImageContent(data=PIXEL, mime_type="image/png")]

    else:

        @server.tool()
        def multiply(a: int, b: int, ctx: Context) -> int:
            """Multiply two integers."""
            record("multiply", ctx)
            return a * b

    @server.tool()
    async def hang(ctx: Context) -> str:
        """Never answer."""
        import anyio

        record("hang", ctx)
        await anyio.sleep_forever()
        return "unreachable"

    return server


def stdio_command(*args: str) -> str:
    """The command that runs this server over stdio with this interpreter (for `MCPTools(command=)`)."""
    return shlex.join([sys.executable, "-m", "orchestrator.testing.mcp_server", *args])


def server_env() -> dict[str, str]:
    """The environment the server needs beyond the SDK's safe defaults: where `orchestrator` is."""
    root = str(Path(__file__).resolve().parents[2])
    return {"PYTHONPATH": root}


def read_log(path: Path) -> list[dict[str, Any]]:
    """The lines the server wrote to its `--log` file (none yet: [])."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HTTPServer:
    """This server over streamable HTTP in a process of its own, on a free port (the same one
    after a restart)."""

    def __init__(self, *, tools: str = "v1", log: Path | None = None) -> None:
        self.port = free_port()
        self.tools = tools
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> HTTPServer:
        args = ["--transport", "streamable-http", "--port", str(self.port), "--tools", self.tools]
        if self.log is not None:
            args += ["--log", str(self.log)]
        env = {**os.environ, **server_env()}
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.testing.mcp_server", *args], env=env)
        wait_until(self._listening, timeout=30, what=f"the MCP server on port {self.port}")
        return self

    def _listening(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"the MCP server exited with {self.proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def __enter__(self) -> HTTPServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A test MCP server (the official mcp SDK's MCPServer).")
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--tools", choices=["v1", "v2"], default="v1")
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.log is not None:
        with args.log.open("a") as f:
            f.write(json.dumps({"serving": os.getpid()}) + "\n")
    server = build(args.tools, args.log)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
