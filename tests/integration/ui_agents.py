"""The agents the run pages' browser tests run (`ratchet api --app tests.integration.ui_agents`),
on the in-process scripted model.

- `ui-researcher`: calls a tool that works and one that fails, then its second model call is
  refused once (HTTP 400): the run ends in ERROR with a tool error in it; continued, it completes.
- `ui-echo`: answers with what its tool returned: markup, which the page must show as text.
- `ui-writer`: writes a long answer a word at a time (streamed runs), slowly enough to be watched.
- `ui-payer`: calls `pay` twice in one batch, a tool that needs a person's approval: the run pauses.
- `ui-shipper`: calls `send_mail` (a person fills in its recipient and copies) and `deploy` (run
  outside, its result given by a person): the run pauses on both.
"""

from orchestrator import Agent, tool
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


@tool(requires_confirmation=True)
def pay(amount: int, to: str) -> str:
    """Pay someone.

    Args:
        amount: In cents.
        to: Who is paid.
    """
    return f"paid {amount} to {to}"


@tool(requires_user_input=True, user_input_fields=["recipient", "copies"])
def send_mail(subject: str, recipient: str, copies: int) -> str:
    """Send a mail.

    Args:
        subject: The subject line.
        recipient: Who gets it.
        copies: How many copies.
    """
    return f"sent {subject!r} to {recipient} x{copies}"


@tool(external_execution=True)
def deploy(service: str) -> str:
    """Deploy a service (the caller runs it)."""
    raise AssertionError("an external call is never run here")


Agent(
    name="ui-payer",
    model=ScriptedModel(
        script=ScriptConfig(
            batches=[
                [
                    {"tool": "pay", "arguments": {"amount": 120, "to": "ann"}},
                    {"tool": "pay", "arguments": {"amount": 75, "to": "bob"}},
                ]
            ],
            final_text="Paid: {tool_results}",
        )
    ),
    tools=[pay],
)
Agent(
    name="ui-shipper",
    model=ScriptedModel(
        script=ScriptConfig(
            batches=[
                [
                    {"tool": "send_mail", "arguments": {"subject": "release notes"}},
                    {"tool": "deploy", "arguments": {"service": "billing"}},
                ]
            ],
            final_text="Shipped: {tool_results}",
        )
    ),
    tools=[send_mail, deploy],
)
