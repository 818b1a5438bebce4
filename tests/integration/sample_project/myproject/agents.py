"""This project's agents: the workers and the API import them (RATCHET_APP=myproject.agents)."""

from orchestrator import Agent
from orchestrator.models import OpenAIChat


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


Agent(name="project-agent", model=OpenAIChat(id="gpt-4o-mini"), tools=[lookup], instructions="Use lookup once.")
