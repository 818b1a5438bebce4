"""A connection to one MCP server through the official `mcp` SDK: its tools listed, and the one
client session per process its calls share.

Listing opens a session of its own and closes it (`list_tools`): a toolkit lists its server when
it is built, at the import of the agent's module, which in a prefork worker is the parent
process, and a session kept there would be inherited by every pool process and used by none.
Calls share one session per process (`call`), opened on the first call and kept on the
process's tool loop (`orchestrator.tools.loop`): a session is an async context (a task group,
the stdio subprocess or the HTTP client) that must be entered and left by one task, so a task
of its own holds it open (`_hold`) while the calls, each in its own task, send requests through
it. A forked process forgets its parent's session and opens its own.

A session is dropped, and the next call opens a new one, when the server is gone: the connection
closed under a call, a request timed out, the transport failed, or the server closed the session
while it was idle (`_Watched`: a stdio server that exited; the next call is then sent on a new
session, never a call that may have reached the server). An error the server answered
(an unknown tool, arguments it refused) leaves the session as it is. Whatever fails is raised as
`MCPToolError` with a message saying which server and what to do; the tool step makes it the
call's tool error (the model reads it), so a server that is down never wedges a step.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import shlex
import sys
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Literal, TextIO, cast
from urllib.parse import urlsplit

import anyio

from orchestrator.errors import ConfigurationError
from orchestrator.tools.loop import process_loop
from orchestrator.untrusted import clip, safe_str

if TYPE_CHECKING:
    from mcp import ClientSession
    from mcp.types import CallToolResult, RequestParamsMeta
    from mcp.types import Tool as ServerTool

log = logging.getLogger("ratchet.mcp")

Transport = Literal["stdio", "streamable-http"]
#: The `_meta` key of a tools/call request that carries the call's idempotency key
#: (`ToolContext.idempotency_key`, `run_id:tool_call_id`: the same on every retry of the call).
IDEMPOTENCY_META_KEY = "ratchet/idempotency_key"
EXTRA = "ratchet-agents[mcp]"
#: The least time opening a session and listing the tools are given.
OPEN_SECONDS = 30.0


class MCPToolError(Exception):
    """An MCP tool call that did not give a result: the server is down, the call failed, or the
    tool reported an error (`isError`). The model reads the message as the call's result."""


def require_sdk() -> None:
    """Import the `mcp` SDK, or ConfigurationError naming the extra that installs it."""
    try:
        import mcp  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            f"MCP tools need the official `mcp` SDK, which is not installed ({exc}): pip install '{EXTRA}'"
        ) from None


class _Held:
    """One session (its `session` set once it is open) and the event that, set on the tool loop,
    closes it."""

    session: ClientSession

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.alive = True

    def close(self) -> None:
        """Close the session (on the tool loop's thread): the next call opens another."""
        self.alive = False
        self.done.set()


class _Watched:
    """The transport's read stream, passed through to the session, calling `on_end` when it ends.

    A stdio server that exits while the session is idle closes its stdout: the SDK's session then
    answers every request "Connection closed" without sending it. Noticing the end here drops the
    session at once, so the next call opens a new one and is sent instead of failing unsent."""

    def __init__(self, stream: Any, on_end: Callable[[], None]) -> None:
        self._stream = stream
        self._on_end = on_end

    async def receive(self) -> Any:
        try:
            return await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __aiter__(self) -> _Watched:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _Watched:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __getattr__(self, name: str) -> Any:  # what the session reads of the stream (`last_context`)
        return getattr(self._stream, name)


class _Unsent(Exception):
    """The session had ended before the call was sent: nothing reached the server."""


_connections: weakref.WeakSet[MCPConnection] = weakref.WeakSet()


class MCPConnection:
    """How to reach one MCP server (a command run over stdio, or a streamable HTTP URL), and
    this process's session to it."""

    def __init__(
        self,
        *,
        command: str | None = None,
        url: str | None = None,
        transport: Transport | None = None,
        env: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = 10.0,
    ) -> None:
        self.transport: Transport = _transport_of(command, url, transport)
        self.command, self.args = _split(command) if command is not None else ("", [])
        self.url = url or ""
        self.env = dict(env or {})
        self.headers = dict(headers or {})
        if not (isinstance(timeout_seconds, (int, float)) and timeout_seconds > 0):
            raise ConfigurationError(f"MCPTools: timeout_seconds={timeout_seconds!r} must be a positive number")
        #: How long each call may take for its answer.
        self.timeout_seconds = float(timeout_seconds)
        #: How long opening a session (with the listing) may take: a server its command starts
        #: may take seconds to import before it answers.
        self.open_seconds = max(OPEN_SECONDS, self.timeout_seconds)
        self._lock = threading.Lock()
        self._held: _Held | None = None
        _connections.add(self)

    @property
    def server(self) -> str:
        """The server as messages name it, never with an argument, path, query, env or header,
        any of which may hold a secret (`--header "Authorization: Bearer ..."`, a key in the URL's
        path): these messages become tool results and events, which the store keeps. A stdio
        server is its program's name and a short hash of its whole command (which tells two
        commands of one program apart), an HTTP server its scheme, host and port."""
        if self.transport == "stdio":
            digest = hashlib.sha256(shlex.join([self.command, *self.args]).encode()).hexdigest()[:8]
            program = clip(os.path.basename(self.command) or self.command, 80)
            return f"stdio server `{program}` (command #{digest})"
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        return f"streamable-http server {clip(f'{parts.scheme}://{host}', 200)}"

    def reason(self, exc: BaseException) -> str:
        """What failed, in one line, without the secrets of the URL, command, env or headers (an
        HTTP error's text names the URL it was for, path and query and all)."""
        text = _reason(exc)
        for secret in self._secrets():
            text = text.replace(secret, "***")
        return text

    def _secrets(self) -> list[str]:
        """Every piece of the URL (but its scheme, host and port), of the command's arguments and
        of the env's and headers' values that could hold a secret, longest first."""
        parts = urlsplit(self.url)
        pieces = [self.url, parts.path, parts.query, parts.fragment, parts.password or "", parts.username or ""]
        pieces += re.split(r"[/&=]", f"{parts.path}&{parts.query}")
        for value in [*self.args, *self.env.values(), *self.headers.values()]:
            pieces += [value, *re.split(r"[\s=:,;]+", value)]
        return sorted({p for p in pieces if len(p) >= _SHORTEST_SECRET}, key=len, reverse=True)

    # ------------------------------------------------------------ the session's context

    @property
    def connected(self) -> bool:
        """Whether this process holds a session to the server that has not ended."""
        held = self._held
        return held is not None and held.alive

    async def _enter(self, stack: AsyncExitStack, on_end: Callable[[], None] | None = None) -> ClientSession:
        """Open the transport and an initialized session inside `stack` (`on_end` called when the
        server closes it)."""
        from mcp import ClientSession

        if self.transport == "stdio":
            from mcp.client.stdio import StdioServerParameters, stdio_client

            params = StdioServerParameters(command=self.command, args=self.args, env=self.env or None)
            streams = await stack.enter_async_context(stdio_client(params, errlog=_errlog()))
        else:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            timeout = httpx2.Timeout(30.0, read=max(300.0, self.timeout_seconds))
            client = await stack.enter_async_context(httpx2.AsyncClient(headers=self.headers, timeout=timeout))
            streams = await stack.enter_async_context(streamable_http_client(self.url, http_client=client))
        read, write = streams
        if on_end is not None:
            read = _Watched(read, on_end)
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        return session

    # ------------------------------------------------------------ listing

    def list_tools(self) -> list[ServerTool]:
        """Every tool the server lists (all pages), through a session opened for it and closed;
        ConfigurationError when the server cannot be listed (it is down, or not an MCP server)."""
        try:
            tools: list[ServerTool] = process_loop().run(self._list())
        except Exception as exc:
            raise ConfigurationError(
                f"MCPTools: could not list the tools of the {self.server}: {self.reason(exc)}. Start the server (or "
                "fix its command or URL) before the agent's module is imported: its tools are listed then"
            ) from None
        return tools

    async def _list(self) -> list[ServerTool]:
        from mcp.types import PaginatedRequestParams

        tools: list[ServerTool] = []
        with anyio.fail_after(self.open_seconds):
            async with AsyncExitStack() as stack:
                session = await self._enter(stack)
                cursor: str | None = None
                while True:
                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        return tools

    # ------------------------------------------------------------ calls

    def call(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> CallToolResult:
        """Call the server's tool `name` through this process's session (opened if there is none
        or the last one was dropped); MCPToolError when no result came back. A session that had
        ended before the call was sent is replaced once: nothing reached the server, so sending the
        call on a new session is no second call."""
        for _ in range(2):
            held = self._session()
            try:
                result: CallToolResult = process_loop().run(self._call(held, name, arguments, meta))
            except _Unsent:
                continue
            return result
        raise MCPToolError(
            f"the {self.server} ended two sessions before the call of {name!r} could be sent; the call was not made"
        )

    async def _call(self, held: _Held, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> CallToolResult:
        from mcp import MCPError
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        if not held.alive:  # it ended after `_session` handed it out
            raise _Unsent
        try:
            return await held.session.call_tool(
                name, arguments, read_timeout_seconds=self.timeout_seconds, meta=cast("RequestParamsMeta", meta)
            )
        except MCPError as exc:
            if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                held.close()
                raise MCPToolError(
                    f"the {self.server} did not answer the call of {name!r}: {self.reason(exc)}; its session was "
                    "closed and the next call opens a new one. The call may or may not have taken effect"
                ) from None
            raise MCPToolError(f"the {self.server} refused the call of {name!r}: {self.reason(exc)}") from None
        except Exception as exc:
            held.close()
            raise MCPToolError(
                f"the call of {name!r} to the {self.server} failed: {self.reason(exc)}; its session was closed and the "
                "next call opens a new one. The call may or may not have taken effect"
            ) from None

    def _session(self) -> _Held:
        """This process's open session, opened now if there is none (one opening at a time)."""
        with self._lock:
            held = self._held
            if held is not None and held.alive:
                return held
            self._held = None
            ready: Future[_Held] = Future()
            task = process_loop().portal.start_task_soon(self._hold, ready)
            try:
                held = ready.result()
            except BaseException as exc:
                task.cancel()  # the caller gave up (its time limit) or the opening failed: no session is left open
                # Only the opening's own failure is the call's tool error. Anything else was raised
                # in this thread as it waited: a soft time limit (SoftTimeLimitExceeded, an Exception
                # a signal raises) must end the step, not become a result the model reads.
                if ready.done() and not ready.cancelled() and ready.exception() is exc:
                    raise MCPToolError(
                        f"the {self.server} is unavailable ({self.reason(exc)}); the call was not made"
                    ) from None
                raise
            self._held = held
            return held

    async def _hold(self, ready: Future[_Held]) -> None:
        """Open a session, hand it to `ready`, and keep it open until it is closed or fails."""
        held = _Held()
        try:
            # One scope around the whole session (its task groups nest inside it): its deadline
            # bounds the opening, then is lifted for the session's life.
            with anyio.CancelScope(deadline=anyio.current_time() + self.open_seconds) as scope:
                async with AsyncExitStack() as stack:
                    held.session = await self._enter(stack, on_end=lambda: self._ended(held))
                    scope.deadline = math.inf
                    ready.set_result(held)
                    await held.done.wait()
            if scope.cancelled_caught and not ready.done():
                raise TimeoutError(f"no session within {self.open_seconds:g} s")
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.info("the session to the %s ended: %s", self.server, self.reason(exc))
        except BaseException:
            if not ready.done():
                ready.set_exception(MCPToolError(f"opening a session to the {self.server} was cancelled"))
            raise
        finally:
            held.alive = False

    def _ended(self, held: _Held) -> None:
        """The server closed the session (a stdio server exited): drop it, so the next call opens another."""
        if held.alive:
            log.info("the %s closed its session; the next call opens a new one", self.server)
            held.close()

    def forget(self) -> None:
        """Drop the session without closing it: it belongs to the process this one forked from."""
        self._lock = threading.Lock()
        self._held = None


def _transport_of(command: str | None, url: str | None, transport: str | None) -> Transport:
    if (command is None) == (url is None):
        raise ConfigurationError(
            "MCPTools needs one of command= (a server run over stdio) or url= (a server over streamable HTTP)"
        )
    chosen = transport or ("stdio" if command is not None else "streamable-http")
    if chosen == "sse":
        raise ConfigurationError(
            "MCPTools: the sse transport is not supported (it is deprecated in MCP); serve the server over "
            "streamable HTTP and pass transport='streamable-http'"
        )
    if chosen not in ("stdio", "streamable-http"):
        raise ConfigurationError(f"MCPTools: transport={chosen!r} is not one of 'stdio', 'streamable-http'")
    if (chosen == "stdio") != (command is not None):
        given = "command=" if command is not None else "url="
        raise ConfigurationError(f"MCPTools: transport={chosen!r} does not go with {given}; stdio takes a command")
    return "stdio" if chosen == "stdio" else "streamable-http"


def _split(command: str) -> tuple[str, list[str]]:
    try:
        parts = shlex.split(command)
    except ValueError as exc:
        raise ConfigurationError(
            f"MCPTools: command= cannot be split into words ({exc}); quote it as a shell would"
        ) from None
    if not parts:
        raise ConfigurationError("MCPTools: command= is empty; give the command that runs the server")
    return parts[0], parts[1:]


#: The shortest piece of a command or URL a failure's text is scrubbed of: shorter ones (`-y`,
#: `v1`) are no secret, and replacing them would garble the text.
_SHORTEST_SECRET = 4


def _errlog() -> TextIO:
    """Where a stdio server's stderr goes: the process's own stderr (a worker may have replaced
    `sys.stderr` by a logging proxy with no file descriptor), or nowhere."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (OSError, ValueError, AttributeError):
            continue
    return open(os.devnull, "w")  # kept for the process's life, as a stderr is


def _reason(exc: BaseException) -> str:
    """What failed, in one line: an exception group's first leaf, named by its type."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = safe_str(exc) or "no message"
    return clip(f"{type(exc).__name__}: {text}", 500)


def _forget_after_fork() -> None:
    for connection in list(_connections):
        connection.forget()


os.register_at_fork(after_in_child=_forget_after_fork)
