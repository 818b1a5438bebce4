"""A Claude agent with a tool: Anthropic's Messages API through the official `anthropic` SDK.

`Claude(id=...)` is Agno's name and constructor. It needs the extra (`pip install
'ratchet-agents[anthropic]'`) and reads its key from ANTHROPIC_API_KEY at each call, on the
workers. The stored transcript keeps Agno's fields whatever the provider, so the run reads the
same as one on OpenAI: the model's calls in `tool_calls`, each result a tool message. The usage
counts Anthropic's cache reads and writes in the input tokens, and the cost is at the model's
prices.

Run it with `ratchet demo claude_agent` (SQLite, a broker that needs no server, an in-process
worker, and the project's scripted server speaking Anthropic's Messages API unless
ANTHROPIC_API_KEY is set), or against your own workers: `ratchet worker --app examples.claude_agent`.
"""

import os

from orchestrator import Agent
from orchestrator.models import Claude
from orchestrator.testing.script import ScriptConfig
from orchestrator.usage import Prices


def exchange_rate(currency: str) -> str:
    """Today's rate of a currency against the euro."""
    return {"USD": "1 EUR = 1.08 USD", "GBP": "1 EUR = 0.85 GBP"}.get(currency.upper(), f"no rate for {currency}")


agent = Agent(
    name="claude-rates",
    model=Claude(id="claude-haiku-4-5", max_tokens=1024, prices=Prices(input=1.0, output=5.0)),
    tools=[exchange_rate],
    instructions="Look up each currency the user asks about (in parallel), then answer in one sentence.",
)

#: What the scripted server answers when ANTHROPIC_API_KEY is not set: two calls in one reply.
SCRIPT = ScriptConfig(
    batches=[
        [
            {"tool": "exchange_rate", "arguments": {"currency": "USD"}},
            {"tool": "exchange_rate", "arguments": {"currency": "GBP"}},
        ]
    ],
    final_text="Today {tool_results}.",
)


def main() -> None:
    out = agent.run("How many dollars and pounds is a euro today?", timeout=120)
    print(f"status={out.status}")
    for i, m in enumerate(out.messages):
        calls = f" calls={[c['function']['name'] for c in m.tool_calls]}" if m.tool_calls else ""
        print(f"  [{i}] {m.role}: {m.content}{calls}")
    usage = out.metrics
    print(f"tokens in={usage.input_tokens} (cached {usage.cache_read_tokens}) out={usage.output_tokens}")
    print(f"cost={usage.cost:.6f}" if usage.cost is not None else "cost unknown")


if __name__ == "__main__":
    from contextlib import ExitStack

    from orchestrator.testing.anthropic_wire import anthropic_base_url
    from orchestrator.testing.server import ScriptedServer
    from workers.cli.demo import demo_environment

    with ExitStack() as stack:
        if not os.environ.get("ANTHROPIC_API_KEY"):
            server = stack.enter_context(ScriptedServer(SCRIPT))
            os.environ["ANTHROPIC_BASE_URL"] = anthropic_base_url(server.url)
            os.environ["ANTHROPIC_API_KEY"] = "sk-ant-scripted-demo"
            print(f"(scripted Messages API at {os.environ['ANTHROPIC_BASE_URL']}; set ANTHROPIC_API_KEY for Claude)\n")
        stack.enter_context(demo_environment(SCRIPT, quiet=True))
        main()
