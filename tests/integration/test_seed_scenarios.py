"""The seed's three scenarios, for an agent and for a team with members=[], on SQLite and on
PostgreSQL, with a real Celery worker on real Redis and the real openai client talking to the
scripted model server."""

from __future__ import annotations

import uuid

import pytest

from orchestrator import Agent, Client, RunNotContinuableError, RunStatus, Team
from orchestrator.models import OpenAIChat, OpenAIResponses
from orchestrator.settings import Settings
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.integration.fencing import kinds, wait_for_late_commit
from tests.integration.test_model_faults_on_a_worker import redis_texts, store_texts

BAD_KEY = "sk-invalid-key-deliberately-broken-to-force-auth-error"

pytestmark = pytest.mark.usefixtures("worker")


def broken_tool(query: str) -> str:
    """A tool that always raises."""
    raise ValueError(f"this tool always fails on query={query}")


def define(kind: str, settings: Settings, *, tools: list[object] | None = None, model: object = None) -> Agent:
    cls = Team if kind == "team" else Agent
    extra = {"members": []} if kind == "team" else {}
    return cls(
        name=f"{kind}-{uuid.uuid4().hex[:6]}",
        model=model or OpenAIResponses(id="gpt-5.4"),
        tools=tools or [],
        instructions="Call broken_tool once with the user's query, then summarize.",
        client=Client(settings),
        **extra,
    )


@pytest.fixture(params=["agent", "team"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_tool_error_becomes_a_tool_message_and_the_run_completes(
    kind: str, settings: Settings, scripted: ScriptedServer
) -> None:
    team = define(kind, settings, tools=[broken_tool])
    session_id = f"sess-A-{uuid.uuid4().hex[:6]}"

    out = team.run("hello", session_id=session_id, timeout=30)

    assert out.status == RunStatus.COMPLETED
    roles = [m.role for m in out.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    tool_msg = out.messages[3]
    assert tool_msg.tool_call_error is True
    assert tool_msg.content == "this tool always fails on query=hello"
    assert tool_msg.tool_name == "broken_tool" and tool_msg.tool_args == {"query": "hello"}
    assert tool_msg.tool_call_id == out.messages[2].tool_calls[0]["id"]  # type: ignore[index]

    # A fresh reader shares nothing with the team object but the database.
    session = Client(settings).get_session(session_id)
    assert session is not None and len(session.runs) == 1
    stored = session.runs[0]
    assert stored.run_id == out.run_id and stored.status == RunStatus.COMPLETED
    assert stored.messages == out.messages
    assert len(stored.tools) == 1 and stored.tools[0].tool_call_error


def test_b_a_401_before_any_tool_batch_leaves_an_error_row_with_the_conversation(
    kind: str, settings: Settings, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted.configure(scripted.config.model_copy(update={"reject_keys": [BAD_KEY]}))
    monkeypatch.setenv("OPENAI_API_KEY", BAD_KEY)
    team = define(kind, settings)

    out = team.run("say hi", session_id=f"sess-B-{uuid.uuid4().hex[:6]}", timeout=30)

    assert out.status == RunStatus.ERROR  # returned, not raised
    assert out.error is not None and out.error.type == "AuthenticationError"
    assert "401" in out.error.message and BAD_KEY not in out.error.message
    assert [(m.role, m.content) for m in out.messages] == [
        ("system", "Call broken_tool once with the user's query, then summarize."),
        ("user", "say hi"),
    ]
    # Final errors are not retried: the model saw exactly one call.
    assert [r["status"] for r in scripted.requests_for(out.run_id)] == [401]


def test_c_continue_with_the_key_fixed_resumes_the_same_run_in_place(
    kind: str, settings: Settings, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run that failed with 401
    scripted.configure(scripted.config.model_copy(update={"reject_keys": [BAD_KEY]}))
    monkeypatch.setenv("OPENAI_API_KEY", BAD_KEY)
    team = define(kind, settings)
    session_id = f"sess-C-{uuid.uuid4().hex[:6]}"
    failed = team.run("say hi", session_id=session_id, timeout=30)
    assert failed.status == RunStatus.ERROR

    # When the key is fixed on the worker (read at call time: no restart) and the run continued
    monkeypatch.setenv("OPENAI_API_KEY", "sk-a-good-key-for-the-scripted-model")
    resumed = team.continue_run(failed.run_id, session_id=session_id, timeout=30)

    # Then it is the same run, completed, with the earlier messages kept in front
    assert resumed.run_id == failed.run_id
    assert resumed.status == RunStatus.COMPLETED and resumed.error is None
    assert resumed.messages[:2] == failed.messages
    assert [m.role for m in resumed.messages] == ["system", "user", "assistant"]
    session = Client(settings).get_session(session_id)
    assert session is not None and [r.run_id for r in session.runs] == [failed.run_id]
    assert session.runs[0].status == RunStatus.COMPLETED


def test_the_chat_completions_model_runs_the_same_story(settings: Settings, scripted: ScriptedServer) -> None:
    agent = define("agent", settings, tools=[broken_tool], model=OpenAIChat(id="gpt-4o-mini"))
    out = agent.run("hello", timeout=30)
    assert out.status == RunStatus.COMPLETED
    assert [m.role for m in out.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert {r["api"] for r in scripted.requests} == {"chat"}


def test_continue_on_a_cancelled_run_is_refused_with_a_clear_error(
    settings: Settings, scripted: ScriptedServer
) -> None:
    # Given a run cancelled while its first model call is in flight (held at the model until then)
    scripted.holding.hold()
    agent = define("agent", settings)
    client = Client(settings)
    handle = agent.start("hello")
    wait_until(lambda: scripted.requests_for(handle.run_id), what="the model call to be in flight")
    cancelled = client.cancel(handle.run_id)
    assert cancelled.status == RunStatus.CANCELLED

    # When the call returns and its step tries to commit
    scripted.holding.release()
    events = wait_for_late_commit(client.store, client.store.get_record(handle.run_id))

    # Then that commit was fenced: the run is as the cancel left it, with the user's message kept
    assert "fenced" in kinds(events), f"the cancelled step's commit got through: {events}"
    out = client.get_run(handle.run_id)
    assert out.status == RunStatus.CANCELLED and out.messages == cancelled.messages
    assert [(m.role, m.content) for m in out.messages] == [("user", "hello")]
    # And the run cannot be continued
    with pytest.raises(RunNotContinuableError, match="cancelled; a cancelled run is final"):
        client.continue_run(handle.run_id)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_the_three_scenarios_on_claude(
    kind: str, settings: Settings, scripted: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.models import Claude
    from orchestrator.testing.anthropic_wire import anthropic_base_url

    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_base_url(scripted.url))
    good_key = "sk-ant-a-good-key-for-the-scripted-model"
    monkeypatch.setenv("ANTHROPIC_API_KEY", good_key)
    scripted.configure(scripted.config.model_copy(update={"reject_keys": [BAD_KEY]}))

    # A: the tool's error is a tool message and the run completes
    out = define(kind, settings, tools=[broken_tool], model=Claude(id="claude-x")).run("hello", timeout=30)
    assert out.status == RunStatus.COMPLETED
    assert [m.role for m in out.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert out.messages[3].tool_call_error and out.messages[3].content == "this tool always fails on query=hello"
    assert out.messages[4].content == "Summary: this tool always fails on query=hello"

    # B: a 401 before any tool batch is final, on the ERROR row with the conversation
    monkeypatch.setenv("ANTHROPIC_API_KEY", BAD_KEY)
    team = define(kind, settings, model=Claude(id="claude-x"))
    failed = team.run("say hi", timeout=30)
    assert failed.status == RunStatus.ERROR and failed.error is not None
    assert failed.error.type == "AuthenticationError" and "401" in failed.error.message
    assert BAD_KEY not in failed.error.message
    assert [m.role for m in failed.messages] == ["system", "user"]
    assert [r["status"] for r in scripted.requests_for(failed.run_id)] == [401]

    # C: continued with the key fixed, the same run completes in place
    monkeypatch.setenv("ANTHROPIC_API_KEY", good_key)
    resumed = team.continue_run(failed.run_id, timeout=30)
    assert resumed.run_id == failed.run_id and resumed.status == RunStatus.COMPLETED
    assert [m.role for m in resumed.messages] == ["system", "user", "assistant"]
    assert {r["api"] for r in scripted.requests} == {"messages"}
    # Neither key reached the store nor the broker (the API key tests do every form; this is Claude's)
    texts = [*store_texts(settings.database_url), *redis_texts(settings.broker_url)]
    assert not [t for t in texts if BAD_KEY in t or good_key in t or BAD_KEY[-10:] in t]
