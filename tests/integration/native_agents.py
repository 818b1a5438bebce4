"""The agent the native-worker tests' workers import (RATCHET_APP=tests.integration.native_agents)."""

import os

import openai  # noqa: F401  (imported before the pool forks, not in each replaced child's first call)

from orchestrator import Agent
from orchestrator.models import OpenAIChat


def whoami(query: str) -> str:
    """Say which process runs this call."""
    return f"pid {os.getpid()}"


Agent(name="native-agent", model=OpenAIChat(id="gpt-4o-mini"), tools=[whoami], instructions="Call whoami once.")
