"""Session history (`add_history_to_context`, `num_history_runs`) on SQLite and PostgreSQL, stepped
inline by the in-memory dispatcher on a real store: which earlier runs a run's prompt includes, and
that the choice, fixed at its first step, is the same on every later attempt of the run."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from orchestrator import Agent, ConfigurationError, RunStatus, Team
from orchestrator.errors import FencedError
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from tests.conftest import settings_env
from workers.api.routes import create_app
from workers.cli.commands import main as ratchet

S = RunStatus
#: The scripted model's answer lists every user text it was shown, history first.
SEEN = ScriptConfig(tool_batches=0, final_text="seen: {users}", chat=True)


def chat(**options: object) -> Agent:
    return Agent(name=f"chat-{uuid.uuid4().hex[:8]}", model=ScriptedModel(script=SEEN), **options)  # type: ignore[arg-type]


def seen(content: object) -> list[str]:
    assert isinstance(content, str) and content.startswith("seen: "), content
    return content.removeprefix("seen: ").split(" | ")


@pytest.fixture
def inline(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url) as dispatcher:
        yield dispatcher


@pytest.fixture
def manual(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url, autorun=False) as dispatcher:
        yield dispatcher


def stored_history(dispatcher: InMemoryDispatcher, run_id: str) -> list[list[object]] | None:
    stored = dispatcher.store.get_record(run_id).history
    return None if stored is None else json.loads(stored)


def test_history_is_off_by_default_as_in_agno(inline: InMemoryDispatcher) -> None:
    agent = chat()
    agent.run("my name is Ada", session_id="s1")

    second = agent.run("what is my name?", session_id="s1")

    assert seen(second.content) == ["what is my name?"]
    assert stored_history(inline, second.run_id) is None  # nothing chosen, nothing read


def test_a_run_sees_the_last_n_completed_runs_of_its_session_oldest_first(inline: InMemoryDispatcher) -> None:
    agent = chat(add_history_to_context=True, num_history_runs=2)
    other = agent.run("another session's secret", session_id="elsewhere")
    runs = [agent.run(f"turn {i}", session_id="s1") for i in range(1, 4)]

    fourth = agent.run("turn 4", session_id="s1")

    # Turns 2 and 3 with their answers, then the new input; turn 1 is beyond num_history_runs.
    assert seen(fourth.content) == ["turn 2", "turn 3", "turn 4"]
    assert [r for r, _ in stored_history(inline, fourth.run_id) or []] == [runs[1].run_id, runs[2].run_id]
    assert fourth.history_run_ids == [runs[1].run_id, runs[2].run_id]  # what a producer reads back
    assert seen(runs[0].content) == ["turn 1"] and seen(other.content) == ["another session's secret"]
    # The history is context, not the run's own transcript: its messages are its own.
    assert [m.content for m in fourth.messages if m.role == "user"] == ["turn 4"]


def test_agnos_default_is_three_runs_and_a_bad_count_is_refused_at_definition() -> None:
    assert chat(add_history_to_context=True).num_history_runs == 3
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(ConfigurationError, match="num_history_runs"):
            chat(add_history_to_context=True, num_history_runs=bad)


def test_runs_in_error_or_cancelled_are_skipped(inline: InMemoryDispatcher) -> None:
    agent = chat(add_history_to_context=True, num_history_runs=5)
    agent.run("kept 1", session_id="s1")
    assert isinstance(agent.model, ScriptedModel)
    agent.model.script = SEEN.model_copy(update={"faults": [Fault(status=400, message="bad request")]})
    failed = agent.run("failed", session_id="s1")
    assert failed.status == S.ERROR
    agent.model.script = SEEN
    inline.autorun = False
    cancelled = agent.start("cancelled", session_id="s1")
    assert agent.client.cancel(cancelled.run_id).status == S.CANCELLED
    inline.autorun = True
    inline.run_until_idle()

    last = agent.run("last", session_id="s1")

    assert seen(last.content) == ["kept 1", "last"]


def test_two_runs_started_together_never_see_each_others_half_finished_messages(
    manual: InMemoryDispatcher,
) -> None:
    # Each run calls a tool first, so after one step each has a user message, an assistant
    # turn and (after its tool step) a tool result committed, and is not COMPLETED.
    agent = Agent(
        name=f"chat-{uuid.uuid4().hex[:8]}",
        model=ScriptedModel(script=SEEN.model_copy(update={"tool_batches": 1, "tool": "note"})),
        tools=[note],
        add_history_to_context=True,
    )
    first = agent.start("first", session_id="s1")
    second = agent.start("second", session_id="s1")
    assert [manual.run_next() for _ in range(2)]  # both first model steps: each chose its history

    manual.run_until_idle()

    assert seen(first.wait(timeout=5).content) == ["first"]
    assert seen(second.wait(timeout=5).content) == ["second"]
    third = agent.start("third", session_id="s1")
    manual.run_until_idle()
    assert seen(third.wait(timeout=5).content) == ["first", "second", "third"]


def note(text: str) -> str:
    """Write a note."""
    return f"noted {text}"


def test_the_history_is_fixed_at_the_first_step_so_a_retry_and_a_continue_build_the_same_prompt(
    manual: InMemoryDispatcher,
) -> None:
    agent = chat(add_history_to_context=True)
    # The first call of every run fails with a 503: the step is parked and retried.
    assert isinstance(agent.model, ScriptedModel)
    agent.model.script = SEEN.model_copy(update={"faults": [Fault(status=503, times=1)]})
    early = agent.start("early", session_id="s1")
    manual.run_until_idle()
    assert early.wait(timeout=5).status == S.COMPLETED
    late = agent.start("late", session_id="s1")
    manual.run_next()  # its first attempt fails after fixing the history: parked for a retry
    assert late.status() == S.QUEUED
    chosen = stored_history(manual, late.run_id)
    assert [r for r, _ in chosen or []] == [early.run_id]
    # Another run of the session completes between the attempts.
    agent.model.script = SEEN
    between = agent.start("between", session_id="s1")
    assert {p.run_id for p in manual.pending} == {late.run_id, between.run_id}
    manual.run_until_idle()

    out = late.wait(timeout=5)

    assert seen(out.content) == ["early", "late"]  # not "between": it finished after the choice
    assert stored_history(manual, late.run_id) == chosen
    assert seen(between.wait(timeout=5).content) == ["early", "between"]
    # A continue of the completed run forks it: the fork has the same history, not the run twice.
    fork = agent.client.continue_run(late.run_id, input="and again")
    manual.run_until_idle()
    assert seen(fork.wait(timeout=5).content) == ["early", "late", "and again"]


def test_a_first_run_stores_an_empty_history_and_a_lost_claim_stores_none(manual: InMemoryDispatcher) -> None:
    agent = chat(add_history_to_context=True)
    session = f"s-{uuid.uuid4().hex[:6]}"
    # A session's first run: nothing to choose, and that choice is stored (not left unset)
    first = agent.start("hello", session_id=session)
    manual.run_until_idle()
    assert first.wait(timeout=5).status == S.COMPLETED
    assert stored_history(manual, first.run_id) == []

    # A claim whose lease ran out before the history was fixed: its holder stores nothing and is told
    later = agent.start("again", session_id=session)
    lost = manual.store.claim(later.run_id, 0, "model", owner="host:1:slow", lease_seconds=-1, max_attempts=5)
    assert lost is not None
    with pytest.raises(FencedError, match="lost before its history was fixed"):
        manual.store.history(lost, 3)
    assert stored_history(manual, later.run_id) is None


def test_a_teams_member_runs_are_not_the_leaders_history(inline: InMemoryDispatcher) -> None:
    member = Agent(
        name=f"member-{uuid.uuid4().hex[:8]}",
        role="answers",
        model=ScriptedModel(script=SEEN),
        add_history_to_context=True,
    )
    leader = ScriptConfig(
        batches=[[{"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "answer it"}}]],
        final_text="team saw: {users}",
        chat=True,
    )
    team = Team(
        name=f"team-{uuid.uuid4().hex[:8]}",
        model=ScriptedModel(script=leader),
        members=[member],
        add_history_to_context=True,
    )
    first = team.run("question one", session_id="s1")
    assert first.status == S.COMPLETED, first.error

    second = team.run("question two", session_id="s1")

    # The leader sees its own earlier run, not the member runs' messages ("answer it").
    assert second.content == "team saw: question one | question two"
    # The member's second run sees its own earlier member run, not the leader's transcript.
    [member_run] = second.member_runs
    assert seen(member_run.content) == ["answer it", "answer it"]


def test_ratchet_show_and_the_http_api_say_which_runs_a_runs_context_held(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = chat(add_history_to_context=True)
    first = agent.run("one", session_id="s1")
    second = agent.run("two", session_id="s1")
    for key, value in settings_env(inline.settings).items():
        monkeypatch.setenv(key, value)

    assert ratchet(["show", second.run_id]) == 0
    assert ratchet(["show", first.run_id]) == 0

    out = capsys.readouterr().out
    assert f"history: 1 earlier run(s) of the session in its context: {first.run_id}" in out
    assert "history: 0 earlier run(s) of the session in its context: none yet" in out
    api = TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost")
    assert api.get(f"/runs/{second.run_id}").json()["history_run_ids"] == [first.run_id]
