"""An agent whose tools come from an MCP server.

`MCPTools(command=...)` runs a local MCP server over stdio (here the project's test server, built
with the official `mcp` SDK: `python -m orchestrator.testing.mcp_server`) and lists its tools when
this module is imported, so when a worker starts: each is offered to the model with the server's
own JSON schema, and the agent catalog the worker writes holds them. `include_tools` keeps two of
them. Each call the model makes is a tool call of its batch like any other, committed as it
finishes; the server gets the call's idempotency key in the request's `_meta`
(`ratchet/idempotency_key`), which its `echo` tool shows. A server reached over HTTP is
`MCPTools(url="http://host:port/mcp", transport="streamable-http")`.

Run it with `make demo` (SQLite, a broker that needs no server, an in-process worker, and the
project's scripted model unless OPENAI_API_KEY is set), or against your own Redis, PostgreSQL and
workers: `ratchet worker --app examples.mcp_agent`. It needs the `mcp` extra:
`pip install 'ratchet-agents[mcp]'`.
"""

from orchestrator import Agent, Client
from orchestrator.catalog import entries
from orchestrator.models import OpenAIChat
from orchestrator.testing.mcp_server import server_env, stdio_command
from orchestrator.testing.script import ScriptConfig
from orchestrator.tools.mcp import MCPTools

calculator = Agent(
    name="mcp-calculator",
    model=OpenAIChat(id="gpt-4o-mini"),
    tools=[MCPTools(command=stdio_command(), env=server_env(), include_tools=["add", "echo"])],
    instructions="Use the add tool for sums and echo to repeat a text, then answer in one sentence.",
)

#: What the scripted model answers when OPENAI_API_KEY is not set: both tools in one batch.
SCRIPT = ScriptConfig(
    batches=[[{"tool": "add", "arguments": {"a": 19, "b": 23}}, {"tool": "echo", "arguments": {"text": "hello"}}]],
    final_text="Done: {tool_results}.",
)


def main() -> None:
    client = Client()
    [entry] = entries(client.store, client.settings, calculator.name)
    print("the catalog, as the worker wrote it when it started:")
    for t in entry.definition.tools:
        print(f"  {t.name}: {t.description} {sorted(t.parameters.get('properties', {}))}")

    out = calculator.start("What is 19 + 23? And say hello back.").wait(timeout=120)
    print(f"\nrun {out.run_id}: {out.status.value}")
    for m in out.messages:
        if m.role == "assistant" and m.calls:
            print("  model asked: " + ", ".join(f"{c.name}({c.arguments})" for c in m.calls))
        elif m.role == "tool":
            print(f"  {m.tool_name} -> {m.content}" + (" [tool_call_error]" if m.tool_call_error else ""))
    print(f"  answer: {out.content}")


if __name__ == "__main__":
    from workers.cli.demo import demo_environment

    with demo_environment(SCRIPT):
        main()
