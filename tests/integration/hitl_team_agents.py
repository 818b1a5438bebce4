"""The team of tests/integration/test_hitl_teams.py, which its worker subprocesses import
(`--app tests.integration.hitl_team_agents`): a top team whose desk (a team) has a payer, two
levels down, whose `pay` needs a person's confirmation, and a writer. The scripted model server
answers each by its model id ("top", "desk", "payer", "writer")."""

from __future__ import annotations

import os

import openai  # noqa: F401  (imported before the pool forks, not in each child's first call)

from orchestrator import Agent, Team, tool
from orchestrator.models import OpenAIChat

#: The file each call of `pay` that took effect adds a line to: the process group of the worker
#: that ran it (a worker started in a session of its own: its main process's pid).
LEDGER = "HITL_TEAMS_LEDGER"


@tool(requires_confirmation=True)
def pay(amount: int, to: str) -> str:
    """Pay someone.

    Args:
        amount: In cents.
        to: Who is paid.
    """
    with open(os.environ[LEDGER], "a") as ledger:
        ledger.write(f"{os.getpgid(0)}\n")
    return f"paid {amount} to {to}"


payer = Agent(name="hitl-teams-payer", model=OpenAIChat(id="payer"), tools=[pay], role="Pays people.")
desk = Team(name="hitl-teams-desk", model=OpenAIChat(id="desk"), members=[payer], role="Runs the payments.")
writer = Agent(name="hitl-teams-writer", model=OpenAIChat(id="writer"), role="Writes the note.")
top = Team(name="hitl-teams-top", model=OpenAIChat(id="top"), members=[desk, writer])
