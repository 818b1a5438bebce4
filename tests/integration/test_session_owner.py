"""A session belongs to the user of its first run, on SQLite and PostgreSQL, stepped inline by the
in-memory dispatcher on a real store: a run for another user in it is refused and writes nothing
(two first runs racing included), and its history and state never cross users, also for runs
that were written into one session for several users before the rule (rows moved by hand)."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Connection, func, select, text, update
from starlette.testclient import TestClient

from orchestrator import Agent, RunConflictError, RunStatus, SessionOwnedError, Team, ToolContext
from orchestrator.messages import Message
from orchestrator.store import Store
from orchestrator.store.tables import messages, runs
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.testing.waiting import wait_until
from tests.conftest import settings_env
from tests.support import migrate_to
from workers.api.routes import create_app
from workers.cli.commands import main as ratchet

S = RunStatus
#: The scripted model's answer lists every user text it was shown, history first.
SEEN = ScriptConfig(tool_batches=0, final_text="seen: {users}", chat=True)
#: What alice's runs carry that nobody else may read.
SECRET = "alice's card is 4242"


def chat(**options: Any) -> Agent:
    return Agent(name=f"chat-{uuid.uuid4().hex[:8]}", model=ScriptedModel(script=SEEN), **options)


def seen(content: object) -> list[str]:
    assert isinstance(content, str) and content.startswith("seen: "), content
    return content.removeprefix("seen: ").split(" | ")


def peek(note: str, ctx: ToolContext) -> str:
    """Read the session state, then set a key in it."""
    shown = json.dumps(ctx.session_state, sort_keys=True)
    ctx.session_state[note] = True
    return shown


@pytest.fixture
def inline(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url) as dispatcher:
        yield dispatcher


@pytest.fixture
def manual(db_url: str) -> Iterator[InMemoryDispatcher]:
    with in_memory(db_url, autorun=False) as dispatcher:
        yield dispatcher


def stored(store: Store) -> tuple[int, int]:
    """How many runs and messages the store holds."""
    with store.engine.connect() as conn:
        return (
            conn.execute(select(func.count()).select_from(runs)).scalar_one(),
            conn.execute(select(func.count()).select_from(messages)).scalar_one(),
        )


def move_into(store: Store, run_id: str, session_id: str, **values: Any) -> None:
    """Put a run into another session, as a store written before the rule could hold it: one
    session with runs of several users."""
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(session_id=session_id, **values))


def test_a_run_for_another_user_in_a_session_is_refused_and_writes_nothing(inline: InMemoryDispatcher) -> None:
    agent = chat(add_history_to_context=True)
    client = inline.client
    alice = agent.run(SECRET, session_id="s-owned", user_id="alice", session_state={"card": "4242"})
    assert alice.status == S.COMPLETED
    before = stored(inline.store)

    for other in ("bob", None):  # no user is a user too: refused both ways
        with pytest.raises(SessionOwnedError) as refused:
            client.start(agent.name, input="bob's note", session_id="s-owned", user_id=other, session_state={"x": 1})
        said = str(refused.value)
        assert "session 's-owned' belongs to another user" in said and "a new session_id" in said
        assert not any(leak in said for leak in ("alice", "bob", "4242", "card"))

    assert stored(inline.store) == before  # no run row, no message
    assert client.get_session_state("s-owned") == {"card": "4242"}  # not merged
    assert [r.run_id for r in client.list_runs(session_id="s-owned").runs] == [alice.run_id]
    # Alice goes on in her session; a session whose first run had no user takes only runs without one.
    assert agent.run("again", session_id="s-owned", user_id="alice").status == S.COMPLETED
    assert agent.run("anonymous", session_id="s-none").status == S.COMPLETED
    with pytest.raises(SessionOwnedError):
        client.start(agent.name, input="carol", session_id="s-none", user_id="carol")
    assert seen(agent.run("anonymous again", session_id="s-none").content) == ["anonymous", "anonymous again"]


def test_of_two_first_runs_racing_for_a_new_session_only_one_users_is_written(
    inline: InMemoryDispatcher, db_url: str
) -> None:
    store, client = inline.store, inline.client
    outcome: list[BaseException | str] = []
    # Alice's first run is written in a transaction held open while bob's start comes in.
    with store.engine.begin() as conn:
        store.create_run(
            run_id=str(uuid.uuid4()), session_id="s-race", agent_name="nobody", kind="agent",
            input_messages=[Message(role="user", content=SECRET)], publish_grace=60, user_id="alice", conn=conn,
        )  # fmt: skip

        def bob() -> None:
            try:
                outcome.append(client.start("nobody", input="bob's note", session_id="s-race", user_id="bob"))
            except BaseException as exc:
                outcome.append(exc)

        racer = threading.Thread(target=bob)
        racer.start()
        if db_url.startswith("postgresql"):  # bob's statement waits on alice's uncommitted session
            wait_until(lambda: waiting_on_a_lock(store), timeout=10, what="bob's start to wait on alice's")
    racer.join(10)

    assert len(outcome) == 1 and isinstance(outcome[0], SessionOwnedError), outcome
    assert [r.user_id for r in client.list_runs(session_id="s-race").runs] == ["alice"]


def waiting_on_a_lock(store: Store) -> bool:
    with store.quick_engine.connect() as conn:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        return bool(conn.execute(text(query)).scalar_one())


def test_history_never_crosses_users_even_in_a_session_written_for_several_before_the_rule(
    manual: InMemoryDispatcher,
) -> None:
    agent = chat(add_history_to_context=True, num_history_runs=5)
    first = agent.start(SECRET, session_id="s-mixed", user_id="alice")
    manual.run_until_idle()
    # Bob's run, written into alice's session as an older store allowed.
    bob = agent.start("bob's words", session_id=f"s-{uuid.uuid4().hex[:6]}", user_id="bob")
    move_into(manual.store, bob.run_id, "s-mixed")
    manual.run_until_idle()

    assert seen(bob.wait(timeout=5).content) == ["bob's words"]  # not alice's secret
    before = stored(manual.store)
    with pytest.raises(SessionOwnedError, match=f"run {bob.run_id} is in a session that belongs to another user"):
        agent.client.continue_run(bob.run_id, input="fork it")  # a fork of it would join alice's session
    assert stored(manual.store) == before
    second = agent.start("alice two", session_id="s-mixed", user_id="alice")
    manual.run_until_idle()
    assert seen(second.wait(timeout=5).content) == [SECRET, "alice two"]  # not bob's words
    assert second.wait(timeout=5).history_run_ids == [first.run_id]

    # A history stored before the rule that names bob's run: its messages are left out of the
    # prompt, read from the database (the first fork) and from the worker's memory (the second).
    chosen = [[r, manual.store.get_record(r).n_messages] for r in (first.run_id, bob.run_id)]
    move_into(manual.store, second.run_id, "s-mixed", history=json.dumps(chosen))
    manual.store.histories = type(manual.store.histories)()  # as a worker that read nothing yet
    for key in ("one", "two"):
        fork = agent.client.continue_run(second.run_id, input=f"more {key}", fork_key=key)
        manual.run_until_idle()
        assert seen(fork.wait(timeout=5).content) == [SECRET, "alice two", f"more {key}"]


def test_a_runs_tools_never_read_or_change_another_users_session_state(
    manual: InMemoryDispatcher, caplog: pytest.LogCaptureFixture
) -> None:
    script = ScriptConfig(batches=[[{"tool": "peek", "arguments": {"note": "touched"}}]], final_text="{tool_results}")
    agent = Agent(name=f"peek-{uuid.uuid4().hex[:8]}", model=ScriptedModel(script=script), tools=[peek])
    client = manual.client
    alice = agent.start("hi", session_id="s-state", user_id="alice", session_state={"card": "4242"})
    manual.run_until_idle()
    assert alice.wait(timeout=5).tools[0].result == '{"card": "4242"}'
    # Bob's run, written into alice's session as an older store allowed.
    assert isinstance(agent.model, ScriptedModel)
    agent.model.script = script.model_copy(update={"batches": [[{"tool": "peek", "arguments": {"note": "bob"}}]]})
    bob = agent.start("hi", session_id=f"s-{uuid.uuid4().hex[:6]}", user_id="bob")
    move_into(manual.store, bob.run_id, "s-state")
    manual.run_until_idle()

    out = bob.wait(timeout=5)
    assert out.status == S.COMPLETED and out.tools[0].result == "{}"  # it saw none of alice's state
    assert f"run {bob.run_id}: its session is another user's; its change to the session state is not kept" in (
        caplog.text
    )
    assert out.session_state == {}
    assert client.get_session_state("s-state") == {"card": "4242", "touched": True}  # alice's own change only
    assert client.get_run(alice.run_id).session_state == {"card": "4242", "touched": True}
    # The session is alice's: bob has none by that id; alice's view holds only her runs.
    assert client.get_session("s-state", user_id="bob") is None
    assert client.get_session_state("s-state", user_id="bob") == agent.get_session_state("s-state", user_id="bob") == {}
    assert client.get_session_state("s-state", user_id="alice") == {"card": "4242", "touched": True}
    mine = client.get_session("s-state", user_id="alice")
    assert mine is not None and [r.run_id for r in mine.runs] == [alice.run_id]
    everyone = client.get_session("s-state")
    assert everyone is not None and {r.run_id: r.session_state for r in everyone.runs} == {
        alice.run_id: {"card": "4242", "touched": True},
        bob.run_id: {},
    }


def test_a_teams_members_join_its_session_for_its_user(inline: InMemoryDispatcher) -> None:
    member = Agent(
        name=f"member-{uuid.uuid4().hex[:8]}", role="answers", model=ScriptedModel(script=SEEN),
        add_history_to_context=True,
    )  # fmt: skip
    leader = ScriptConfig(
        batches=[[{"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "answer it"}}]],
        final_text="team saw: {users}",
        chat=True,
    )
    team = Team(name=f"team-{uuid.uuid4().hex[:8]}", model=ScriptedModel(script=leader), members=[member])

    for user in ("alice", None):
        session = f"s-{uuid.uuid4().hex[:6]}"
        for _ in range(2):
            out = team.run("question", session_id=session, user_id=user)
            assert out.status == S.COMPLETED, out.error
            assert [m.user_id for m in out.member_runs] == [user]
        fork = inline.client.continue_run(out.run_id, input="more").wait(5)
        assert fork.status == S.COMPLETED and fork.user_id == user


def test_a_run_id_taken_by_another_users_run_is_refused_without_naming_that_run(inline: InMemoryDispatcher) -> None:
    agent = chat()
    alice = inline.client.start(agent.name, input=SECRET, session_id="s-taken", user_id="alice", run_id="r-taken")
    assert alice.wait(timeout=5).status == S.COMPLETED

    for other in ("bob", None):
        with pytest.raises(RunConflictError) as refused:
            inline.client.start(agent.name, input=SECRET, run_id="r-taken", user_id=other)
        said = str(refused.value)
        assert "run_id 'r-taken' is taken by another run" in said
        assert not any(leak in said for leak in ("alice", "s-taken", agent.name))
    assert inline.client.start(agent.name, input=SECRET, run_id="r-taken", user_id="alice").run_id == "r-taken"


def test_the_http_api_answers_409_naming_neither_user_and_a_session_of_another_user_is_404(
    inline: InMemoryDispatcher,
) -> None:
    agent = chat()
    agent.run(SECRET, session_id="s-http", user_id="alice", session_state={"card": "4242"})
    http = TestClient(create_app(inline.settings, client=inline.client), base_url="http://localhost")
    before = stored(inline.store)

    refused = http.post("/runs", json={"agent": agent.name, "input": "hi", "session_id": "s-http", "user_id": "bob"})

    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["type"] == "SessionOwnedError" and "a new session_id" in error["message"]
    assert not any(leak in refused.text for leak in ("alice", "bob", "4242"))
    assert stored(inline.store) == before
    other = http.get("/sessions/s-http", params={"user_id": "bob"})
    assert other.status_code == 404 and "4242" not in other.text and "alice" not in other.text
    assert http.get("/sessions/s-http", params={"user_id": "alice"}).json()["session_state"] == {"card": "4242"}
    # Into another user's session with a key never used: that refusal as it is, not the key's
    keyed = http.post(
        "/runs", json={"agent": agent.name, "input": "hi", "session_id": "s-http", "user_id": "bob"},
        headers={"Idempotency-Key": "fresh-key-1"},
    )  # fmt: skip
    assert keyed.status_code == 409 and keyed.json()["error"]["type"] == "SessionOwnedError", keyed.text
    assert "Idempotency-Key" not in keyed.text
    # An Idempotency-Key alice used, sent by another user or with none: keys are per user, so it
    # starts a run of its own and names nothing of alice's, not even its id
    key = {"Idempotency-Key": "order-42"}
    mine = http.post("/runs", json={"agent": agent.name, "input": "a question", "user_id": "alice"}, headers=key)
    assert mine.status_code == 202, mine.text
    again = http.post("/runs", json={"agent": agent.name, "input": "a question", "user_id": "alice"}, headers=key)
    assert again.json()["run_id"] == mine.json()["run_id"]
    for other in ({"user_id": "bob"}, {}):
        theirs = http.post("/runs", json={"agent": agent.name, "input": "a question", **other}, headers=key)
        assert theirs.status_code == 202, theirs.text
        started = theirs.json()
        assert started["run_id"] != mine.json()["run_id"] and started["user_id"] == other.get("user_id")
        leaks = ("alice", "4242", mine.json()["session_id"], mine.json()["run_id"])
        assert not any(leak in theirs.text for leak in leaks)


def test_the_command_line_prints_the_refusal_and_exits_1(
    inline: InMemoryDispatcher, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    agent = chat()
    agent.run(SECRET, session_id="s-cli", user_id="alice")
    for key, value in settings_env(inline.settings).items():
        monkeypatch.setenv(key, value)
    before = stored(inline.store)

    assert ratchet(["run", agent.name, "hi", "--session", "s-cli", "--user-id", "bob"]) == 1
    assert ratchet(["session", "s-cli", "--user-id", "bob"]) == 1

    out = capsys.readouterr()
    assert out.out == ""
    assert "ratchet: error: session 's-cli' belongs to another user" in out.err and "a new session_id" in out.err
    assert "ratchet: error: no session 's-cli' of user_id 'bob'" in out.err
    assert "alice" not in out.err and "4242" not in out.err
    assert stored(inline.store) == before


def sessions_and_runs_of_0010(conn: Connection) -> None:
    """Sessions as a Ratchet before the rule left them: made by a run without a user, then joined
    by one user's runs ('s-bob') or by two users' ('s-mixed'); one of no user's runs only; one
    whose first run had a user."""
    owners = {"s-bob": None, "s-mixed": None, "s-none": None, "s-alice": "alice"}
    users = {
        "s-bob": [None, "bob", "bob"],
        "s-mixed": [None, "bob", "carol"],
        "s-none": [None, None],
        "s-alice": ["alice", "bob"],
    }
    for session_id, owner in owners.items():
        conn.execute(
            text("insert into ratchet_sessions (session_id, user_id, created_at) values (:s, :u, 1.0)"),
            {"s": session_id, "u": owner},
        )
        for k, user in enumerate(users[session_id]):
            conn.execute(
                text(
                    "insert into ratchet_runs (run_id, session_id, agent_name, kind, status, epoch, seq, next_step,"
                    " n_messages, attempts, retries, publish_after, created_at, updated_at, user_id)"
                    " values (:r, :s, 'old', 'agent', 'COMPLETED', 1, 1, null, 0, 0, 0, null, :t, :t, :u)"
                ),
                {"r": f"{session_id}-{k}", "s": session_id, "t": 1.0 + k, "u": user},
            )


def test_upgrading_gives_a_session_to_the_one_user_whose_runs_joined_it_before_the_rule(old_database: str) -> None:
    # Given sessions written before the rule (migrated to 0010, the revision before it)
    migrate_to(old_database, "0010_metrics", sessions_and_runs_of_0010)

    # When the store migrates them
    with in_memory(old_database) as inline:
        with inline.store.engine.connect() as conn:
            owners = dict(conn.execute(text("select session_id, user_id from ratchet_sessions")).all())
        agent = chat()

        # Then a session made without a user and joined by one user's runs is that user's: bob goes on in it
        assert owners == {"s-bob": "bob", "s-mixed": None, "s-none": None, "s-alice": "alice"}
        assert agent.run("bob again", session_id="s-bob", user_id="bob").status == S.COMPLETED
        with pytest.raises(SessionOwnedError):
            inline.client.start(agent.name, input="x", session_id="s-bob")
        # and one of two users' runs, or of none, keeps no owner: no run with a user joins it
        for session_id in ("s-mixed", "s-none"):
            with pytest.raises(SessionOwnedError):
                inline.client.start(agent.name, input="x", session_id=session_id, user_id="bob")
        # and a session whose first run had a user stays that user's
        with pytest.raises(SessionOwnedError):
            inline.client.start(agent.name, input="x", session_id="s-alice", user_id="bob")
