"""A multi-turn chat: each run of the session sees the earlier ones (Agno's session history).

`add_history_to_context=True` puts the session's last `num_history_runs` completed runs (their
user messages, answers and tool calls) before each new message. Which runs a run's context holds
is chosen when its first step is claimed and stored with the run, so a retry, a worker crash or
a continue of that run builds the same prompt, even if the session moved on meanwhile. Runs that
failed or were cancelled are left out, as Agno leaves them out.

Run it with `make demo` (SQLite, a broker that needs no server, an in-process worker, and the
project's scripted model unless OPENAI_API_KEY is set: the scripted model answers with every user
message it was shown, so you can see what each run's context held).
"""

import uuid

from orchestrator import Agent, Client
from orchestrator.models import OpenAIChat
from orchestrator.testing.script import ScriptConfig

agent = Agent(
    name="chat-assistant",
    model=OpenAIChat(id="gpt-4o-mini"),
    instructions="You are a friendly assistant. Answer in one or two sentences.",
    add_history_to_context=True,
    num_history_runs=3,
)

#: What the scripted model answers when OPENAI_API_KEY is not set: what it was shown.
SCRIPT = ScriptConfig(tool_batches=0, final_text="(the scripted model was shown: {users})", chat=True)

TURNS = [
    "Hi! My name is Ada and I am learning Celery.",
    "What should I read first?",
    "What is my name, and what am I learning?",
]


def main() -> None:
    session_id = f"chat-{uuid.uuid4().hex[:8]}"
    for text in TURNS:
        out = agent.run(text, session_id=session_id, timeout=120)
        print(f"user:      {text}\nassistant: {out.content}  [{out.status.value}]\n")
    session = Client().get_session(session_id)
    assert session is not None
    print(f"session {session_id}: {len(session.runs)} runs, each storing only its own messages:")
    for run in session.runs:
        print(f"  {run.run_id[:8]} [{run.status.value}] {[m.role for m in run.messages]}")


if __name__ == "__main__":
    from workers.cli.demo import demo_environment

    with demo_environment(SCRIPT):
        main()
