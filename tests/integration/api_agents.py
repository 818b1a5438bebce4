"""The agent the API's event tests run (`ratchet api --app tests.integration.api_agents`): the
in-process scripted model, which writes its reply in word-sized deltas when a run is streamed."""

from orchestrator import Agent
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel


def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


Agent(
    name="api-streamer",
    model=ScriptedModel(
        script=ScriptConfig(
            batches=[[{"tool": "lookup", "arguments": {"q": "otters"}}]],
            final_text="Otters hold hands while they sleep, {tool_results}",
        )
    ),
    tools=[lookup],
)
