"""MCP tools: the tools of an MCP server as a toolkit, in Agno's shape.

    Agent(name="files", model=..., tools=[MCPTools(command="npx -y @modelcontextprotocol/server-filesystem /data")])
    Agent(name="docs", model=..., tools=[MCPTools(url="http://docs:8000/mcp", transport="streamable-http")])

`MCPTools` lists the server's tools when it is built (at the import of the agent's module, so
when a worker starts) and offers each to the model with the server's own `inputSchema`; the
catalog a worker writes at boot holds them like any tool's (a server that lists other tools
after a deploy gives the agent another definition). Each call is a tool call of the batch like
any other: committed as it finishes, never run again once finished, `at_most_once` if named in
`at_most_once_tools`, paused for a person if named in `requires_confirmation_tools` or
`external_execution_required_tools`. Its idempotency key (`ToolContext.idempotency_key`) goes
in the request's `_meta` under `ratchet/idempotency_key`, with `ratchet/run_id` and
`ratchet/tool_call_id`, for a server that deduplicates side effects.

The result's content blocks become the tool message: text as it is, an embedded text resource's
text, other blocks summarized in one line (`[image: image/png, 1234 bytes]`); no block but
structured content: that content as JSON. A result flagged `isError`, a server that is down and
a call that fails are the call's tool error (`tool_call_error=True`), which the model reads.
Sessions: `orchestrator.tools.mcp_session`. The SDK is the `ratchet-agents[mcp]` extra,
imported only when an `MCPTools` is built.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConfigurationError, ToolArgumentsError
from orchestrator.models.base import ToolSpec
from orchestrator.tools.mcp_session import IDEMPOTENCY_META_KEY, MCPConnection, MCPToolError, Transport, require_sdk
from orchestrator.tools.tool import Tool, ToolContext
from orchestrator.tools.toolkit import Toolkit
from orchestrator.untrusted import clip

if TYPE_CHECKING:
    from mcp.types import CallToolResult
    from mcp.types import Tool as ServerTool

__all__ = ["IDEMPOTENCY_META_KEY", "MCPTool", "MCPToolError", "MCPTools", "render"]


class MCPTools(Toolkit):
    """The tools of one MCP server. `command=` runs the server over stdio (its `env` merged over
    the SDK's safe defaults: PATH, HOME, ...; nothing else of the worker's environment reaches
    it); `url=` reaches it over streamable HTTP (`headers` sent with each request).
    `timeout_seconds` bounds each call (opening a session and the listing get at least 30 s: a
    server its command starts may take seconds to import). `tool_name_prefix`
    offers each tool as `<prefix>_<name>`. The lists (`include_tools`, `exclude_tools`,
    `at_most_once_tools`, `requires_confirmation_tools`, `external_execution_required_tools`)
    name the server's tools by the server's names; naming one it does not list is a
    configuration error that says what it lists."""

    def __init__(
        self,
        command: str | None = None,
        *,
        url: str | None = None,
        transport: Transport | None = None,
        env: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_seconds: float = 10.0,
        include_tools: Sequence[str] | None = None,
        exclude_tools: Sequence[str] | None = None,
        tool_name_prefix: str | None = None,
        at_most_once_tools: Sequence[str] | None = None,
        requires_confirmation_tools: Sequence[str] | None = None,
        external_execution_required_tools: Sequence[str] | None = None,
        name: str = "mcp",
        instructions: str | None = None,
        add_instructions: bool = False,
        queue: str | None = None,
    ) -> None:
        require_sdk()
        self.connection = MCPConnection(
            command=command, url=url, transport=transport, env=env, headers=headers, timeout_seconds=timeout_seconds
        )
        self.tool_name_prefix = tool_name_prefix
        listed = self.connection.list_tools()
        server_names = [t.name for t in listed]
        lists = {
            "include_tools": include_tools,
            "exclude_tools": exclude_tools,
            "at_most_once_tools": at_most_once_tools,
            "requires_confirmation_tools": requires_confirmation_tools,
            "external_execution_required_tools": external_execution_required_tools,
        }
        for list_name, named in lists.items():
            unknown = sorted(set(named or ()) - set(server_names))
            if unknown:
                raise ConfigurationError(
                    f"MCPTools {name}: {list_name} names {unknown}, which the {self.connection.server} does not list; "
                    f"it lists {sorted(server_names)}"
                )
        offered = self._offered_name
        super().__init__(
            name=name,
            instructions=instructions,
            add_instructions=add_instructions,
            include_tools=None if include_tools is None else [offered(n) for n in include_tools],
            exclude_tools=[offered(n) for n in exclude_tools or ()],
            queue=queue,
            requires_confirmation_tools=[offered(n) for n in requires_confirmation_tools or ()],
            external_execution_required_tools=[offered(n) for n in external_execution_required_tools or ()],
        )
        once = set(at_most_once_tools or ())
        for server_tool in listed:
            self.register(
                MCPTool(
                    self.connection, server_tool, name=offered(server_tool.name), at_most_once=server_tool.name in once
                )
            )

    def _offered_name(self, server_name: str) -> str:
        return f"{self.tool_name_prefix}_{server_name}" if self.tool_name_prefix else server_name


class MCPTool(Tool):
    """One tool of an MCP server: the server's schema shown to the model, the model's arguments
    checked against it, the call made through the server's session."""

    def __init__(
        self,
        connection: MCPConnection,
        server_tool: ServerTool,
        *,
        name: str | None = None,
        description: str | None = None,
        at_most_once: bool = False,
        queue: str | None = None,
        requires_confirmation: bool = False,
        requires_user_input: bool = False,
        user_input_fields: list[str] | None = None,
        external_execution: bool = False,
        pause_timeout: float | None = None,
        on_timeout: str | None = None,
    ) -> None:
        # Not Tool.__init__: there is no Python function to read a signature from.
        if requires_user_input:
            raise ConfigurationError(
                f"MCP tool {server_tool.name}: requires_user_input is not offered for MCP tools; use "
                "requires_confirmation_tools or external_execution_required_tools"
            )
        self.connection = connection
        self.server_tool = server_tool
        self.server_name = server_tool.name
        name = name or server_tool.name
        self._settle(
            name=name,
            description=description or server_tool.description or name,
            at_most_once=at_most_once,
            queue=queue,
            requires_confirmation=requires_confirmation,
            requires_user_input=False,
            external_execution=external_execution,
            pause_timeout=pause_timeout,
            on_timeout=on_timeout,
        )
        self.user_input_fields = []
        self._schema: dict[str, Any] = dict(server_tool.input_schema or {"type": "object"})
        self._schema.setdefault("properties", {})

    def _rebuilt(self, settings: dict[str, Any]) -> MCPTool:
        return MCPTool(self.connection, self.server_tool, **settings)

    @property
    def spec(self) -> ToolSpec:
        """The server's schema as it listed it."""
        return ToolSpec(name=self.name, description=self.description, parameters=self._schema)

    def user_input_schema(self) -> list[dict[str, Any]]:
        return []

    @functools.cached_property
    def _validator(self) -> Any:
        """The checker of the server's schema, in the draft the schema names (2020-12 if none)."""
        from jsonschema import validators

        return validators.validator_for(self._schema)(self._schema)

    def parse_arguments(self, raw: str) -> dict[str, Any]:
        """Decode the model's argument text and check it against the server's schema (so a call the
        server would refuse is not sent); ToolArgumentsError says what does not fit."""
        try:
            data = json.loads(raw or "{}")
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ToolArgumentsError(f"arguments are not valid JSON ({type(exc).__name__}): {raw[:200]!r}") from None
        if not isinstance(data, dict):
            raise ToolArgumentsError(f"arguments must be a JSON object, got {type(data).__name__}")
        from jsonschema import exceptions

        try:
            problems = sorted(self._validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        except (exceptions.SchemaError, exceptions.UnknownType, RecursionError):
            problems = []  # a schema that cannot check is the server's to fix; the server checks the arguments too
        if problems:
            text = "; ".join(
                f"{'.'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message}" for e in problems[:5]
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {clip(text, 1000)}")
        return data

    def call(self, arguments: dict[str, Any], context: ToolContext) -> Any:
        """Call the tool on the server, the call's idempotency key in the request's `_meta`."""
        meta = {
            IDEMPOTENCY_META_KEY: context.idempotency_key,
            "ratchet/run_id": context.run_id,
            "ratchet/tool_call_id": context.tool_call_id,
        }
        result = self.connection.call(self.server_name, arguments, meta)
        text = render(result)
        if result.is_error:
            raise MCPToolError(text or f"the MCP tool {self.server_name!r} reported an error without a message")
        return text

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r})"


def render(result: CallToolResult) -> str:
    """A tool result's content blocks as the text the model reads: text blocks as they are, one
    block a line, other blocks summarized; structured content as JSON when there is no block."""
    lines = [_block(b) for b in result.content]
    if not lines and result.structured_content is not None:
        return json.dumps(result.structured_content, default=str)
    return "\n".join(lines)


def _block(block: Any) -> str:
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_size(block.data)} bytes]"
    if kind == "resource_link":
        return f"[resource link: {block.uri}" + (f" ({block.name})" if block.name else "") + "]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        mime = f", {resource.mime_type}" if resource.mime_type else ""
        return f"[resource: {resource.uri}{mime}, {_size(getattr(resource, 'blob', ''))} bytes]"
    return f"[{kind or type(block).__name__} content]"


def _size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)
