"""The agents the run pages' browser tests run (`ratchet api --app tests.integration.ui_agents`),
on the in-process scripted model.

- `ui-researcher`: calls a tool that works and one that fails, then its second model call is
  refused once (HTTP 400): the run ends in ERROR with a tool error in it; continued, it completes.
- `ui-echo`: answers with what its tool returned: markup, which the page must show as text.
- `ui-writer`: writes a long answer a word at a time (streamed runs), slowly enough to be watched.
"""

from orchestrator import Agent
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel

#: What `render_html` returns: a page that ran it as HTML would run its script.
MARKUP = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script><b>bold</b>'
#: The final answer's words ui-writer streams.
WORDS = 40


def lookup(query: str) -> str:
    """Look something up."""
    return f"notes on {query}"


def fetch_page(url: str) -> str:
    """Fetch a web page."""
    raise ConnectionError(f"{url}: connection refused")


def render_html(text: str) -> str:
    """Render some HTML."""
    return MARKUP


Agent(
    name="ui-researcher",
    model=ScriptedModel(
        script=ScriptConfig(
            batches=[
                [
                    {"tool": "lookup", "arguments": {"query": "celery"}},
                    {"tool": "fetch_page", "arguments": {"url": "https://example.org/celery"}},
                ]
            ],
            final_text="Researched: {tool_results}",
            faults=[Fault(turn=2, status=400, times=1, message="the request was refused once")],
        )
    ),
    tools=[lookup, fetch_page],
)
Agent(
    name="ui-echo",
    model=ScriptedModel(
        script=ScriptConfig(
            batches=[[{"tool": "render_html", "arguments": {"text": "hi"}}]], final_text="{tool_results}"
        )
    ),
    tools=[render_html],
)
Agent(
    name="ui-writer",
    model=ScriptedModel(script=ScriptConfig(final_text=" ".join(f"word{i}" for i in range(WORDS)), chunk_delay_s=0.08)),
)
