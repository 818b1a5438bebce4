"""Agents the compose-command test's workers import (`--app tests.integration.compose_agents`)."""

from orchestrator import Agent
from orchestrator.models import OpenAIChat


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


Agent(name="compose-agent", model=OpenAIChat(id="gpt-4o-mini"), tools=[lookup], instructions="Use lookup once.")
