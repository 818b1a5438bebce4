"""The agents, and nothing else: a worker imports this module to find them by name."""

from orchestrator import Team
from orchestrator.models import OpenAIResponses


def broken_tool(query: str) -> str:
    """A tool: a plain function; its JSON schema comes from the signature and docstring."""
    raise ValueError(f"this tool always fails on query={query}")


team = Team(
    name="a-team",
    model=OpenAIResponses(id="gpt-5.4"),
    members=[],
    tools=[broken_tool],
    instructions="Call broken_tool once, then summarize.",
)
