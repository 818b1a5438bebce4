"""The agents of the console's browser tests (`ratchet api --app tests.integration.console_agents`):
the run pages' own (`tests.integration.ui_agents`, imported here so that one module serves both),
and, on the in-process scripted model:

- `ui-chatter`: a chat: each user message gets a `lookup` call, then an answer that repeats the
  message, streamed a word at a time, slowly enough to be watched.
- `ui-crew`: a team whose leader delegates to `ui-helper`, then answers with what it said.
"""

from orchestrator import Agent, Team
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.integration.ui_agents import MARKUP, WORDS, lookup

__all__ = ["CHATTER_WORDS", "MARKUP", "WORDS"]

#: The words `ui-chatter` streams after repeating the message.
CHATTER_WORDS = 30

Agent(
    name="ui-chatter",
    model=ScriptedModel(
        script=ScriptConfig(
            batches=[[{"tool": "lookup", "arguments": {"query": "the question"}}]],
            final_text="You said: {user}. " + " ".join(f"w{i}" for i in range(CHATTER_WORDS)),
            chat=True,
            chunk_delay_s=0.06,
        )
    ),
    tools=[lookup],
)
helper = Agent(name="ui-helper", model=ScriptedModel(script=ScriptConfig(final_text="helped with {user}")))
Team(
    name="ui-crew",
    model=ScriptedModel(
        script=ScriptConfig(
            batches=[[{"tool": TO_MEMBER, "arguments": {"member_id": member_id(helper), "task": "the chores"}}]],
            final_text="The crew says: {tool_results}",
        )
    ),
    members=[helper],
)
