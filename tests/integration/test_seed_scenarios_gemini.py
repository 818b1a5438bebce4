"""The seed's three scenarios on Gemini: an agent and a team with members=[], on PostgreSQL, with a
real Celery worker on real Redis and the real google-genai client talking to the scripted server's
Gemini API. (`test_seed_scenarios` runs them on both databases with the OpenAI adapters.)"""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Client, RunStatus
from orchestrator.models import Gemini
from orchestrator.settings import Settings
from orchestrator.testing.gemini_wire import gemini_base_url
from orchestrator.testing.server import ScriptedServer
from tests.integration.test_model_faults_on_a_worker import redis_texts, store_texts
from tests.integration.test_seed_scenarios import broken_tool, define

GOOD_KEY = "AIzaSeed-good-key-for-the-scripted-model"
BAD_KEY = "AIzaSeed-invalid-key-deliberately-broken"

pytestmark = pytest.mark.usefixtures("worker")


@pytest.fixture
def db_url(pg_url: str) -> str:
    """PostgreSQL only: the store does not care which provider wrote the messages."""
    return pg_url


@pytest.fixture
def gemini_env(scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> ScriptedServer:
    """The scripted server as the Gemini API of the worker (which reads both variables at each call)."""
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", gemini_base_url(scripted))
    monkeypatch.setenv("GOOGLE_API_KEY", GOOD_KEY)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    return scripted


@pytest.fixture(params=["agent", "team"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_tool_error_becomes_a_tool_message_and_the_run_completes_on_gemini(
    kind: str, settings: Settings, gemini_env: ScriptedServer
) -> None:
    team = define(kind, settings, tools=[broken_tool], model=Gemini(id="gemini-2.5-flash"))
    session_id = f"sess-A-{uuid.uuid4().hex[:6]}"

    out = team.run("hello", session_id=session_id, timeout=30)

    assert out.status == RunStatus.COMPLETED
    assert [m.role for m in out.messages] == ["system", "user", "assistant", "tool", "assistant"]
    tool_msg = out.messages[3]
    assert tool_msg.tool_call_error is True and tool_msg.content == "this tool always fails on query=hello"
    assert tool_msg.tool_name == "broken_tool" and tool_msg.tool_args == {"query": "hello"}
    assert tool_msg.tool_call_id == out.messages[2].tool_calls[0]["id"]  # type: ignore[index]
    # The model read the tool's error as the call's result
    assert out.content == "Summary: this tool always fails on query=hello"
    assert out.messages[-1].metrics is not None and out.messages[-1].metrics.reasoning_tokens
    session = Client(settings).get_session(session_id)
    assert session is not None and session.runs[0].messages == out.messages
    assert {r["api"] for r in gemini_env.requests} == {"gemini"}


def test_a_rejected_key_leaves_an_error_row_and_continue_with_the_key_fixed_resumes_in_place_on_gemini(
    kind: str, settings: Settings, gemini_env: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B: a 401 before any tool batch leaves an ERROR row with the conversation, not retried
    gemini_env.configure(gemini_env.config.model_copy(update={"reject_keys": [BAD_KEY]}))
    monkeypatch.setenv("GOOGLE_API_KEY", BAD_KEY)
    team = define(kind, settings, model=Gemini(id="gemini-2.5-flash"))
    session_id = f"sess-C-{uuid.uuid4().hex[:6]}"
    failed = team.run("say hi", session_id=session_id, timeout=30)
    assert failed.status == RunStatus.ERROR
    assert failed.error is not None and failed.error.type == "AuthenticationError"
    assert "401" in failed.error.message and BAD_KEY not in failed.error.message
    assert [(m.role, m.content) for m in failed.messages] == [
        ("system", "Call broken_tool once with the user's query, then summarize."),
        ("user", "say hi"),
    ]
    assert [r["status"] for r in gemini_env.requests_for(failed.run_id)] == [401]

    # C: the key fixed on the worker (read at call time), the run continued: the same run completes
    monkeypatch.setenv("GOOGLE_API_KEY", GOOD_KEY)
    resumed = team.continue_run(failed.run_id, session_id=session_id, timeout=30)
    assert resumed.run_id == failed.run_id and resumed.status == RunStatus.COMPLETED and resumed.error is None
    assert resumed.messages[:2] == failed.messages
    assert [m.role for m in resumed.messages] == ["system", "user", "assistant"]
    session = Client(settings).get_session(session_id)
    assert session is not None and [r.run_id for r in session.runs] == [failed.run_id]
    # Neither key reached the store nor the broker (the API key tests do every form; this is Gemini's)
    texts = [*store_texts(settings.database_url), *redis_texts(settings.broker_url)]
    assert not [t for t in texts if BAD_KEY in t or GOOD_KEY in t or BAD_KEY[-10:] in t]
