"""Tool / model error persistence for a Team, on Ratchet — does the conversation survive?

A port of Agno's cookbook `03_teams/23_checkpointing/02_tool_error_persistence.py` (the seed of
this project) to Ratchet's API. Every model call and tool batch runs as a Celery task on a
worker; the run is checkpointed to SQL between tasks.

SCENARIO A — A tool raises a regular Python exception. The tool batch catches it, turns it into
a tool-role message with ``tool_call_error=True``, commits it, and the run carries on. The run
completes with the error visible in messages. No data loss.

SCENARIO B — The team's model call itself fails before any tool batch (an invalid API key, so
HTTP 401: final, not retried). The task's failure handler flushes the in-flight messages (the
rendered system message) onto the run's ERROR row; the user message was stored when the run was
enqueued. The conversation that led to the failure is preserved.

SCENARIO C — continue the failed (ERROR) team run with the key fixed. ERROR is not COMPLETED, so
continue resumes in place (same run_id, same row). Workers read the API key when they call the
model, so fixing the key needs no restart.

Run it with `make demo` (SQLite, a broker that needs no server, an in-process worker and the
project's scripted model unless OPENAI_API_KEY is set), or against your own Redis, PostgreSQL
and workers: `ratchet worker --app examples.tool_error_persistence`.
"""

import asyncio
import os
import time

from orchestrator import Client, Team
from orchestrator.models import OpenAIResponses

# Agno's seed uses a fresh SQLite file per run; Ratchet keeps one store, so sessions are tagged.
TAG = int(time.time())
SESSION_A = f"sess-A-{TAG}"
SESSION_B = f"sess-B-{TAG}"


def broken_tool(query: str) -> str:
    """A normal tool that always raises. The tool batch catches this: it becomes a tool-role
    message with tool_call_error=True, and the run continues."""
    raise ValueError(f"this tool always fails on query={query}")


def b_team() -> Team:
    """The team of scenarios B and C. Ratchet finds agents by name, so a name has one definition;
    scenario C builds the same team again from here (in Agno's seed it repeats the definition)."""
    return Team(
        name="b-team",
        model=OpenAIResponses(id="gpt-5.4"),
        members=[],
        instructions="You are a helpful assistant. Answer concisely.",
    )


async def scenario_a_tool_error() -> None:
    """Team-level tool raises ValueError -> handled gracefully in the tool batch."""
    print("=" * 70)
    print("SCENARIO A: Tool raises ValueError (caught by the team's tool batch)")
    print("=" * 70)

    team = Team(
        name="a-team",
        model=OpenAIResponses(id="gpt-5.4"),
        members=[],
        tools=[broken_tool],
        instructions="Call broken_tool once with the user's query, then summarize.",
    )
    try:
        response = await team.arun(input="hello", session_id=SESSION_A)
        print(f"team.arun returned. status={response.status}")
        print(f"  run_id: {response.run_id}")
        print(f"  msgs:   {len(response.messages or [])}")
    except Exception as e:
        print(f"team.arun RAISED unexpectedly: {type(e).__name__}: {e}")

    # A fresh reader: nothing shared with the team object but the database.
    session = Client().get_session(SESSION_A)
    if session and session.runs:
        for r in session.runs:
            print(f"\nDB run: status={r.status}, msgs={len(r.messages or [])}, tools={len(r.tools or [])}")
            for i, m in enumerate(r.messages or []):
                err = " [tool_call_error]" if getattr(m, "tool_call_error", False) else ""
                preview = (m.content or "")[:80] if m.content else ""
                print(f"  [{i}] {m.role}: {preview}{err}")
    print()


async def scenario_b_model_call_fails() -> str:
    """The team's model call fails before any tool batch. The failure handler keeps the
    in-flight conversation on the ERROR row. Returns the failed run_id for scenario C."""
    print("=" * 70)
    print("SCENARIO B: Team model call fails (invalid key) — escapes the loop")
    print("=" * 70)

    real_key = os.environ.get("OPENAI_API_KEY", "")
    os.environ["OPENAI_API_KEY"] = "sk-invalid-key-deliberately-broken-to-force-auth-error"
    try:
        team = b_team()
        failed_run_id = ""
        try:
            response = await team.arun(input="say hi", session_id=SESSION_B)
            print(f"team.arun returned. status={response.status}")
            if response.error:
                print(f"  error: {str(response.error)[:120]}")
            failed_run_id = response.run_id or ""
        except Exception as e:
            print(f"team.arun RAISED: {type(e).__name__}: {str(e)[:120]}")

        print("\n--- DB state after failed model call ---")
        os.environ["OPENAI_API_KEY"] = real_key or "sk-not-used"
        session = Client().get_session(SESSION_B)
        if not session or not session.runs:
            print("DB has no runs persisted.")
            return ""
        for r in session.runs:
            msg_count = len(r.messages or [])
            print(f"\nDB run: status={r.status}, msgs={msg_count}")
            if msg_count == 0:
                print("  [empty] messages list is EMPTY — the conversation that led")
                print("          to the failure was lost.")
            else:
                print("  [ok] messages preserved by the failure handler.")
                for i, m in enumerate(r.messages or []):
                    preview = (m.content or "")[:80] if m.content else ""
                    print(f"  [{i}] {m.role}: {preview}")
            if not failed_run_id:
                failed_run_id = r.run_id or ""
        return failed_run_id
    finally:
        if real_key:
            os.environ["OPENAI_API_KEY"] = real_key
        else:
            os.environ.pop("OPENAI_API_KEY", None)


async def scenario_c_continue_failed_run(failed_run_id: str) -> None:
    """Continue the failed (ERROR) team run. ERROR is not COMPLETED, so it resumes in place —
    same run_id. With the messages preserved, the model retries against the conversation."""
    print("=" * 70)
    print("SCENARIO C: continue the failed team run — retry with the same run_id")
    print("=" * 70)

    if not failed_run_id:
        print("No failed run_id from scenario B — skipping.")
        return

    team = b_team()
    try:
        resumed = await team.acontinue_run(run_id=failed_run_id, session_id=SESSION_B)
        print(f"acontinue_run returned. status={resumed.status}")
        print(f"  run_id: {resumed.run_id}")
        print(f"  same as failed run? {resumed.run_id == failed_run_id}")
        print(f"  msgs:   {len(resumed.messages or [])}")
    except Exception as e:
        print(f"acontinue_run RAISED: {type(e).__name__}: {str(e)[:200]}")
        return

    print("\n--- DB state after continue ---")
    session = Client().get_session(SESSION_B)
    if session and session.runs:
        print(f"Session has {len(session.runs or [])} run(s):")
        for r in session.runs:
            print(f"  - {r.run_id} [{r.status}] msgs={len(r.messages or [])}")


async def main() -> None:
    await scenario_a_tool_error()
    print()
    failed_run_id = await scenario_b_model_call_fails()
    print()
    await scenario_c_continue_failed_run(failed_run_id or "")


if __name__ == "__main__":
    from workers.cli.demo import demo_environment

    with demo_environment():
        asyncio.run(main())
