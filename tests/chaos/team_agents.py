"""The team of the team crash tests: a leader and two members whose tools are the chaos ledger's
`effect` (a row each time a call takes effect, so the invariants see one that took effect twice).

Worker subprocesses import it beside `tests.chaos.agents` (see `team_harness.start_team_worker`);
the scripted model answers each by its model id: "leader", "researcher", "writer".
"""

from __future__ import annotations

from orchestrator import Agent, Team
from tests.chaos.agents import MarkedChat, effect

TEAM = "chaos-team"
RESEARCHER = "chaos-researcher"
WRITER = "chaos-writer"

researcher = Agent(name=RESEARCHER, model=MarkedChat(id="researcher"), tools=[effect], role="Finds facts.")
writer = Agent(name=WRITER, model=MarkedChat(id="writer"), tools=[effect], role="Writes the article.")
team = Team(
    name=TEAM,
    model=MarkedChat(id="leader"),
    members=[researcher, writer],
    instructions="Delegate the research and the writing, then combine the answers.",
)
