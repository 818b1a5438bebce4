"""The agents of the page benchmark and of the run pages' screenshots in docs/observability.md
(`ratchet api --app bench.page_agents`), on the in-process scripted model: no model server, no API key.

- `researcher`: looks something up, calls a tool that fails, and its second model call is refused
  once (HTTP 400), so its run ends in ERROR with a tool error in it; continued, it completes.
- `transcriber`: 333 tool batches of two calls each, then an answer: a run of 1,001 messages.
- `crew`: a team whose leader delegates to `researcher` and `writer`.
- `assistant`: a chat for the console's pictures: each message gets a batch of two calls (the
  notes at once, the issue tracker in a quarter of a second), then an answer; each model call
  takes a fifth of a second, so its time axis has something to draw.
"""

import time

from orchestrator import Agent, Team
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel

#: Tool batches of the transcriber: 1 input + 333 x (1 call message + 2 results) + 1 answer = 1,001 messages.
BATCHES = 333


def lookup(query: str) -> str:
    """Look something up in the project's notes."""
    return f"Notes on {query}: a task acknowledged late is redelivered if its worker dies mid-way."


def fetch_page(url: str) -> str:
    """Fetch a web page."""
    raise ConnectionError(f"{url}: connection refused")


def search_issues(query: str) -> str:
    """Search the issue tracker."""
    time.sleep(0.25)
    return f"2 issues mention {query}: #412 (redelivery after a worker restart), #388 (visibility timeout)"


def note(text: str) -> str:
    """Write a line of the transcript."""
    return f"noted: {text}"


researcher = Agent(
    name="researcher",
    model=ScriptedModel(
        id="gpt-4o-mini",
        script=ScriptConfig(
            batches=[
                [
                    {"tool": "lookup", "arguments": {"query": "celery acks_late"}},
                    {"tool": "fetch_page", "arguments": {"url": "https://docs.example.org/celery"}},
                ]
            ],
            final_text="Celery redelivers a late-acknowledged task when its worker dies. {tool_results}",
            faults=[Fault(turn=2, status=400, times=1, message="Invalid 'messages[3].content': string too long")],
        ),
    ),
    tools=[lookup, fetch_page],
    instructions="Answer from the notes; fetch a page when they are not enough.",
    role="Finds facts.",
)


def transcript(batches: int) -> ScriptConfig:
    """The transcriber's script: `batches` tool batches of two calls, then its answer."""
    return ScriptConfig(tool_batches=batches, calls_per_batch=2, tool="note", final_text="Transcribed.")


transcriber = Agent(
    name="transcriber",
    model=ScriptedModel(id="gpt-4o-mini", script=transcript(BATCHES)),
    tools=[note],
    max_tool_batches=BATCHES,
)
writer = Agent(
    name="writer",
    model=ScriptedModel(id="gpt-4o", script=ScriptConfig(final_text="A short article about {user}")),
    role="Writes short articles.",
)
crew = Team(
    name="crew",
    model=ScriptedModel(
        id="gpt-4o",
        script=ScriptConfig(
            batches=[
                [
                    {"tool": TO_MEMBER, "arguments": {"member_id": member_id(writer), "task": "otters holding hands"}},
                    {"tool": TO_MEMBER, "arguments": {"member_id": member_id(researcher), "task": "celery acks_late"}},
                ]
            ],
            final_text="The team's answer: {tool_results}",
        ),
    ),
    members=[writer, researcher],
    instructions="Research, then write.",
)
assistant = Agent(
    name="assistant",
    model=ScriptedModel(
        id="gpt-4o-mini",
        script=ScriptConfig(
            batches=[
                [
                    {"tool": "lookup", "arguments": {"query": "celery redelivery"}},
                    {"tool": "search_issues", "arguments": {"query": "redelivery"}},
                ]
            ],
            final_text="On “{user}”: a task acknowledged late is delivered again when its worker dies "
            "before acknowledging it; issues #412 and #388 are about the same thing.",
            chat=True,
            delay_s=0.2,
        ),
    ),
    tools=[lookup, search_issues],
    instructions="Answer from the notes and the issue tracker.",
)
