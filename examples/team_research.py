"""A research team on Ratchet: a leader delegates to a researcher and a writer, durably.

The leader (a team's model) is offered Agno's delegation tools, `delegate_task_to_member` and
`delegate_task_to_members`, with the members and their roles in its system message. Each
delegation starts the member as its own run (a child of the team run, in the team's session),
with its own model calls and tool batches on the workers. While members work, the team run is
WAITING and holds no worker; the last member to finish hands its answer back as the result of
the leader's delegation call and queues the leader's next model call.

Here the leader first asks the researcher (who has a `search_notes` tool), then gives the
writer the researcher's findings, then answers the user. Run it with `make demo` (SQLite, a
broker that needs no server, an in-process worker, and the project's scripted model unless
OPENAI_API_KEY is set), or against your own Redis, PostgreSQL and workers:
`ratchet worker --app examples.team_research`.
"""

import time

from orchestrator import Agent, Client, RunOutput, RunStatus, Team
from orchestrator.models import OpenAIChat, OpenAIResponses
from orchestrator.testing.script import ScriptConfig

NOTES = {
    "otters": "Sea otters hold hands while sleeping so they do not drift apart; they use stones as tools.",
}


def search_notes(topic: str) -> str:
    """Look a topic up in the team's research notes."""
    return NOTES.get(topic.lower().strip(), f"no notes on {topic}")


researcher = Agent(
    name="researcher",
    model=OpenAIChat(id="gpt-4.1-mini"),
    tools=[search_notes],
    role="Finds facts in the research notes.",
    instructions="Look the topic up with search_notes and report the facts you found, briefly.",
)
writer = Agent(
    name="writer",
    model=OpenAIChat(id="gpt-4o-mini"),
    role="Writes one short, friendly paragraph from the facts it is given.",
)
team = Team(
    name="research-team",
    model=OpenAIResponses(id="gpt-5.4"),
    members=[researcher, writer],
    instructions="First ask the researcher for facts, then ask the writer for a paragraph built on them. "
    "Answer with the writer's paragraph.",
)

#: What the scripted model answers when OPENAI_API_KEY is not set: one script per model id.
SCRIPT = ScriptConfig(
    by_model={
        "gpt-5.4": ScriptConfig(
            batches=[
                [{"tool": "delegate_task_to_member", "arguments": {"member_id": "researcher", "task": "otters"}}],
                [
                    {
                        "tool": "delegate_task_to_member",
                        "arguments": {"member_id": "writer", "task": NOTES["otters"]},
                    }
                ],
            ],
            final_text="From the team: {tool_results}",
        ),
        "gpt-4.1-mini": ScriptConfig(
            batches=[[{"tool": "search_notes", "arguments": {"topic": "otters"}}]],
            final_text="Facts: {tool_results}",
            delay_s=0.5,  # slow enough to watch the team wait
        ),
        "gpt-4o-mini": ScriptConfig(final_text="Did you know? {user}"),
    }
)


def show(run: RunOutput, indent: str = "") -> None:
    """Print a run, its transcript, and its member runs under it."""
    print(f"{indent}run {run.run_id[:8]}  {run.agent_name:<14} {run.status}")
    for m in run.messages:
        if m.role == "system":
            continue
        calls = ", ".join(c.name for c in m.calls)
        text = (m.content or "").replace("\n", " ")
        print(f"{indent}  {m.role:<9} {('-> ' + calls) if calls else text[:100]}")
    for member in run.member_runs:
        show(member, indent + "    ")


def main() -> None:
    client = Client()
    session_id = f"research-{int(time.time())}"
    handle = team.start("Tell me something about otters.", session_id=session_id)
    print(f"started team run {handle.run_id}\n")

    # Member runs are stored and readable while they work; the team waits without a worker.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        run = client.get_run(handle.run_id)
        if run.status == RunStatus.WAITING and run.member_runs:
            print("while the members work:")
            for m in run.member_runs:
                print(f"  member {m.agent_name:<10} {m.status}  (member of {(m.parent_run_id or '')[:8]})")
            print()
            break
        if run.status.is_final:
            break
        time.sleep(0.05)

    out = handle.wait(timeout=120)
    print(f"team run {out.status}: {out.content}\n")
    session = client.get_session(session_id)
    assert session is not None
    print(f"session {session_id}: {len(session.runs)} top-level run(s), member runs under it:")
    for run in session.runs:
        show(run, "  ")


if __name__ == "__main__":
    from workers.cli.demo import demo_environment

    with demo_environment(SCRIPT):
        main()
