"""A streamed run: its events as they happen, the answer's text as it is written.

`agent.run(input, stream=True)` starts the run with streaming on and returns an iterator of its
events (Agno's names): RunStarted, ToolCallStarted and ToolCallCompleted as the tools run,
RunContent for each piece of the answer's text, RunCompleted with the whole answer. Every event
has an id that orders it in the run: a reader that reconnects with the last id it saw
(`Client.stream(run_id, after=id)`, or `ratchet stream RUN_ID --after ID`) gets exactly the rest,
and a reader that comes after the run ended still gets every event the database holds.

Run it with `make demo` (SQLite, a broker that needs no server, an in-process worker, and the
project's scripted model unless OPENAI_API_KEY is set).
"""

from orchestrator import Agent, Client, RunEvent
from orchestrator.models import OpenAIChat
from orchestrator.testing.script import ScriptConfig


def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny and 21 degrees in {city}"


agent = Agent(
    name="weather-reporter",
    model=OpenAIChat(id="gpt-4o-mini"),
    tools=[weather],
    instructions="Look the weather up, then describe it in one sentence.",
)

#: What the scripted model answers when OPENAI_API_KEY is not set.
SCRIPT = ScriptConfig(
    batches=[[{"tool": "weather", "arguments": {"city": "Lisbon"}}]],
    final_text="Good news from the weather desk: it is {tool_results}, a fine day for a walk by the river.",
)


def line(event: RunEvent) -> str:
    """One line for an event that is not a piece of text."""
    if event.tool is not None and event.event == "ToolCallStarted":
        return f"{event.event}: {event.tool.tool_name}({event.tool.tool_args})"
    if event.tool is not None:
        return f"{event.event}: {event.tool.tool_name} -> {event.tool.result}"
    return f"{event.event}" + (f": {event.content}" if event.event == "RunCompleted" else "")


def main() -> None:
    seen: list[RunEvent] = []
    writing = False
    for event in agent.run("What is the weather in Lisbon?", stream=True, timeout=120):
        seen.append(event)
        if event.event == "RunContent":  # the answer as it is written
            print(event.content, end="", flush=True)
            writing = True
            continue
        print(("\n" if writing else "") + f"[{event.id}] {line(event)}", flush=True)
        writing = False

    # A reader that lost its connection after the third event picks up where it left off.
    run_id, last_seen = seen[0].run_id, seen[2].id
    rest = list(Client().stream(run_id, after=last_seen))
    print(f"\nresumed after {last_seen}: {len(rest)} more event(s), the same as the first reader's: {rest == seen[3:]}")


if __name__ == "__main__":
    from workers.cli.demo import demo_environment

    with demo_environment(SCRIPT):
        main()
