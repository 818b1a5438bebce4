"""Agents with queues of their own, for tests/integration/test_routing_workers.py: its workers
import this module (`--app tests.integration.routed_agents`). Every tool says which worker ran it
(WORKER_ROLE in that worker's environment)."""

import os

from orchestrator import Agent, Team, tool
from orchestrator.models import OpenAIChat

ROLE = os.environ.get("WORKER_ROLE", "?")


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query} on {ROLE}"


@tool(queue="gpu")
def render(scene: str) -> str:
    """Render a scene on a GPU."""
    return f"rendered {scene} on {ROLE}"


# Its batches that call `render` go to the gpu queue; the others to the default tools queue.
Agent(name="routed-tools", model=OpenAIChat(id="gpt-4o-mini"), tools=[lookup, render])
# Every step of this one goes to the gpu queue: its model too is only reachable from there.
private = Agent(name="private-agent", model=OpenAIChat(id="private-model"), tools=[lookup], queue="gpu")
# A team whose steps go to the gpu queue too (its leader's model answers only there), delegating
# to the private agent.
Team(name="routed-team", model=OpenAIChat(id="team-model"), members=[private], queue="gpu")
