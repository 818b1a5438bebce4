"""Token usage: each assistant message keeps what the provider reported, a run totals its own
calls and its members', a session totals its runs, prices give a cost, `ratchet show` prints it,
and rows from before the columns read as unknown. A real worker on Redis, the real openai client
against the scripted server (which logs the usage it reports), on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import pytest
from sqlalchemy import Connection, text

from orchestrator import Agent, Client, Metrics, Prices, RunStatus, Team
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat, OpenAIResponses
from orchestrator.settings import Settings
from orchestrator.store import Store
from orchestrator.team import TO_MEMBERS
from orchestrator.testing import in_memory
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.server import ScriptedServer
from tests.conftest import settings_env
from tests.support import migrate_to
from workers.cli.commands import main as ratchet

S = RunStatus
PRICES = Prices(input=2.0, output=8.0)


def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def reported(scripted: ScriptedServer, run_ids: Iterable[str]) -> Metrics:
    """The total of the usage the scripted server reported to these runs, costed at PRICES."""
    usages = [r["usage"] for run_id in run_ids for r in scripted.requests_for(run_id)]
    assert usages and all(u is not None for u in usages)
    return Metrics.total(Metrics.reported(u, PRICES) for u in usages)


def agent(settings: Settings, model: Any) -> Agent:
    return Agent(
        name=f"usage-{uuid.uuid4().hex[:6]}", model=model, tools=[lookup], instructions="Use lookup.",
        client=Client(settings),
    )  # fmt: skip


@pytest.mark.usefixtures("worker")
@pytest.mark.parametrize("model", [OpenAIChat, OpenAIResponses])
def test_a_run_stores_the_same_usage_streamed_or_not_and_its_metrics_are_the_reported_sums(
    settings: Settings, scripted: ScriptedServer, model: Any
) -> None:
    # Given an agent with prices whose run takes two model calls (a tool batch, then an answer)
    worker_agent = agent(settings, model(id="gpt-test", prices=PRICES))

    # When it runs once as a whole and once streamed
    whole = worker_agent.run("find celery", timeout=30)
    events = list(worker_agent.run("find celery", stream=True, timeout=30))
    streamed = worker_agent.client.get_run(events[-1].run_id)

    # Then each run's metrics are the sums of what the provider reported, cost included, and
    # every count is known (cached and reasoning tokens too)
    for out in (whole, streamed):
        assert out.status == S.COMPLETED, out.error
        assert out.metrics == reported(scripted, [out.run_id])
        assert None not in (out.metrics.cache_read_tokens, out.metrics.reasoning_tokens, out.metrics.cost)
        assert out.metrics.input_tokens and out.metrics.cache_read_tokens and out.metrics.reasoning_tokens
    # and streamed and unstreamed calls stored the same usage, message by message, each reply
    # with its model id and its call's duration, and a streamed one its time to first token
    replies = [[m for m in out.messages if m.role == "assistant"] for out in (whole, streamed)]
    timing = {"duration": None, "time_to_first_token": None}
    per_call = [[m.metrics.model_copy(update=timing) for m in each if m.metrics] for each in replies]
    assert len(per_call[0]) == 2 and per_call[0] == per_call[1]
    for each in replies:
        assert [m.model for m in each] == ["gpt-test", "gpt-test"]
        assert all(m.metrics and m.metrics.duration and m.metrics.duration > 0 for m in each)
    assert all(m.metrics and m.metrics.time_to_first_token is None for m in replies[0])  # not streamed
    answer = replies[1][-1].metrics  # streamed text (the tool-calling reply before it wrote none)
    assert answer and answer.time_to_first_token is not None and 0 < answer.time_to_first_token <= answer.duration


@pytest.mark.usefixtures("worker")
def test_a_teams_metrics_include_its_members_and_a_session_totals_its_runs(
    settings: Settings, scripted: ScriptedServer
) -> None:
    # Given a team of two members, all priced, whose leader delegates to both
    t = uuid.uuid4().hex[:6]
    members = [
        Agent(name=f"{who}-{t}", model=OpenAIChat(id=who, prices=PRICES), role=f"The {who}.")
        for who in ("researcher", "writer")
    ]
    team = Team(
        name=f"team-{t}", model=OpenAIResponses(id="leader", prices=PRICES), members=members,
        instructions="Delegate.", client=Client(settings),
    )  # fmt: skip
    scripted.configure(
        ScriptConfig(
            by_model={"leader": ScriptConfig(batches=[[{"tool": TO_MEMBERS, "arguments": {"task": "otters"}}]])}
        )
    )
    session = f"s-{t}"

    # When it runs twice in one session
    first = team.run("otters", session_id=session, timeout=30)
    second = team.run("again", session_id=session, timeout=30)

    # Then each run's metrics total its own calls and its members'
    for out in (first, second):
        assert out.status == S.COMPLETED, out.error
        assert len(out.member_runs) == 2
        runs = [out.run_id, *(m.run_id for m in out.member_runs)]
        assert out.metrics == reported(scripted, runs)
        own = Metrics.total(m.metrics for m in out.messages if m.role == "assistant")
        assert out.metrics.input_tokens is not None and own.input_tokens is not None
        assert out.metrics.input_tokens > own.input_tokens
    # and the session totals both runs
    found = team.client.get_session(session)
    assert found is not None and found.metrics == Metrics.total([first.metrics, second.metrics])


@pytest.mark.usefixtures("worker", "scripted")
def test_ratchet_show_prints_the_runs_tokens_and_cost(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    out = agent(settings, OpenAIChat(id="gpt-test", prices=PRICES)).run("find celery", timeout=30)
    m = out.metrics
    assert m.cost is not None

    assert ratchet(["show", out.run_id]) == 0

    line = (
        f"usage: input={m.input_tokens} (cached {m.cache_read_tokens})  output={m.output_tokens}"
        f" (reasoning {m.reasoning_tokens})  total={m.total_tokens}  cost={m.cost:.6f}"
    )
    assert line in capsys.readouterr().out


# Counts the provider sent as no whole number, in each API's names; the other counts stay the script's.
# A string and a bool that a lenient reading would take for numbers ("12" as 12, false as 0) are
# among them: the counts are read from the JSON as sent.
BAD_COUNTS = [
    pytest.param(OpenAIChat, False, {"prompt_tokens": None, "completion_tokens": [1]}, id="chat-null-list"),
    pytest.param(OpenAIChat, False, {"prompt_tokens": "12", "completion_tokens": True}, id="chat-string-bool"),
    pytest.param(OpenAIChat, True, {"prompt_tokens": "12", "completion_tokens": ""}, id="chat-streamed-strings"),
    pytest.param(OpenAIResponses, False, {"input_tokens": "12", "output_tokens": True}, id="responses-string-bool"),
    pytest.param(OpenAIResponses, False, {"input_tokens": None, "output_tokens": ""}, id="responses-null-empty"),
    pytest.param(OpenAIResponses, True, {"input_tokens": "12", "output_tokens": False}, id="responses-streamed-bool"),
]


@pytest.mark.parametrize(("model", "stream", "fields"), BAD_COUNTS)
def test_counts_the_provider_did_not_send_as_whole_numbers_are_stored_unknown_never_zero(
    db_url: str, scripted: ScriptedServer, model: Any, stream: bool, fields: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # Given a provider whose replies say their input and output tokens as null, a string, a list
    scripted.configure(ScriptConfig(usage_fields=fields))
    with in_memory(db_url) as inline:
        priced = agent(inline.settings, model(id="gpt-test", prices=PRICES))

        # When a run takes its two calls through the openai client (streamed: the chunks as sent)
        if stream:
            run_id = list(priced.run("find celery", stream=True, timeout=30))[-1].run_id
        else:
            run_id = priced.run("find celery", timeout=30).run_id
        out = inline.client.get_run(run_id)
        snapshot = inline.client.metrics()
        for key, value in settings_env(inline.settings).items():
            monkeypatch.setenv(key, value)
        assert ratchet(["show", run_id, "--steps"]) == 0

    # Then each call stored those counts as unknown, the counts it sent as numbers as they were
    assert out.status == S.COMPLETED, out.error
    calls = [m.metrics for m in out.messages if m.role == "assistant"]
    assert len(calls) == 2
    for call in calls:
        assert call is not None and (call.input_tokens, call.output_tokens, call.cost) == (None, None, None)
        assert call.cache_read_tokens is not None and call.reasoning_tokens is not None
    # and the run's total is unknown, not a sum that looks exact, as `ratchet show` and the metrics say
    assert (out.metrics.input_tokens, out.metrics.output_tokens, out.metrics.total_tokens) == (None, None, None)
    assert out.metrics.cost is None and out.metrics.cache_read_tokens
    printed = capsys.readouterr().out
    assert "usage: input=unknown" in printed and "output=unknown" in printed and "total=unknown" in printed
    assert "tokens unknown+unknown" in printed and "None" not in printed
    assert (priced.name, "input") not in snapshot.tokens and (priced.name, "output") not in snapshot.tokens


# ---------------------------------------------------------------- rows from before migration 0005


def rows_of_0004(conn: Connection) -> None:
    conn.execute(text("insert into ratchet_sessions (session_id, created_at) values ('s-old', 1.0)"))
    conn.execute(
        text(
            "insert into ratchet_runs (run_id, session_id, agent_name, kind, status, epoch, seq, next_step,"
            " n_messages, attempts, retries, publish_after, created_at, updated_at)"
            " values ('old', 's-old', 'nobody', 'agent', 'QUEUED', 0, 1, 'model', 2, 0, 0, 2.0, 1.0, 1.0)"
        )
    )
    conn.execute(
        text(
            "insert into ratchet_messages (run_id, idx, role, content, tool_call_error, created_at)"
            " values ('old', 0, 'user', 'hi', false, 1.0), ('old', 1, 'assistant', 'before', false, 1.0)"
        )
    )


def test_usage_of_rows_from_before_the_migration_reads_as_unknown_not_zero(old_database: str) -> None:
    # Given a run whose assistant message was stored before the usage columns existed
    migrate_to(old_database, "0004_run_stream", rows_of_0004)

    # When the store migrates it and the run takes a step whose call reported usage
    store = Store.open(old_database)
    claim = store.claim("old", 1, "model", owner="w1", lease_seconds=30, max_attempts=5)
    assert claim is not None
    after = Metrics(input_tokens=10, output_tokens=4, cache_read_tokens=0, reasoning_tokens=1, cost=None)
    store.commit_step(
        claim, [Message(role="assistant", content="after", metrics=after)], status=S.COMPLETED, next_step=None,
        publish_grace=60, content="after",
    )  # fmt: skip

    # Then the old message's usage is unknown and the new one's is as reported
    out = store.get_output("old")
    assert [(m.content, m.metrics) for m in out.messages] == [("hi", None), ("before", None), ("after", after)]
    # and a total over both is unknown, not the new call's counts alone
    assert out.metrics == Metrics()
    session = store.get_session("s-old")
    assert session is not None and session.metrics == Metrics()
