"""Session state and user ids run by the in-memory dispatcher on a real SQLite store: tools read
and change the state, a run's state merges over the stored one, concurrent calls of one batch
keep each other's changes, a call that fails changes nothing, members and forks keep the user.
Kills and redos on real workers: tests/chaos/test_session_state.py."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from orchestrator import Agent, RunStatus, SessionOwnedError, Team, ToolContext
from orchestrator.team import TO_MEMBER, member_id
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from tests.support import CountingModel

S = RunStatus


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def add_item(item: str, ctx: ToolContext) -> str:
    """Add an item to the shopping list."""
    ctx.session_state.setdefault("shopping_list", []).append(item)
    return f"the list is {ctx.session_state['shopping_list']}"


def calls(tool: str, *items: str, key: str = "item") -> list[dict[str, Any]]:
    return [{"tool": tool, "arguments": {key: i}} for i in items]


def shopper(*batches: list[dict[str, Any]], **kwargs: Any) -> Agent:
    model = CountingModel(script=ScriptConfig(batches=list(batches), final_text="Done: {tool_results}"))
    return Agent(name=name("shopper"), model=model, tools=[add_item], **kwargs)


def test_a_tool_changes_the_session_state_and_the_next_run_of_the_session_reads_it(
    inline: InMemoryDispatcher,
) -> None:
    agent = shopper(calls("add_item", "milk"))

    first = agent.run("add milk", session_id="s-shop")
    agent.model.script = ScriptConfig(batches=[calls("add_item", "eggs")])  # type: ignore[attr-defined]
    second = agent.run("add eggs", session_id="s-shop")

    assert first.status == second.status == S.COMPLETED
    assert first.tools[0].result == "the list is ['milk']"
    assert second.tools[0].result == "the list is ['milk', 'eggs']"
    assert second.session_state == {"shopping_list": ["milk", "eggs"]}
    session = inline.client.get_session("s-shop")
    assert session is not None and session.session_state == {"shopping_list": ["milk", "eggs"]}
    assert agent.get_session_state("s-shop") == {"shopping_list": ["milk", "eggs"]}
    assert agent.get_session_state("s-never") == {}


def test_defaults_fill_what_the_stored_state_lacks_and_a_runs_state_wins_over_both(inline: InMemoryDispatcher) -> None:
    agent = shopper(session_state={"shopping_list": [], "currency": "EUR", "limit": 10})

    fresh = agent.run("hello", session_id="s-defaults")
    merged = agent.run("again", session_id="s-defaults", session_state={"currency": "USD", "note": "vip"})
    later = agent.run("and again", session_id="s-defaults")

    assert fresh.session_state == {"shopping_list": [], "currency": "EUR", "limit": 10}
    # The run's keys were merged over the stored state, and the defaults did not put theirs back.
    assert merged.session_state == later.session_state == {
        "shopping_list": [], "currency": "USD", "limit": 10, "note": "vip",
    }  # fmt: skip


def test_concurrent_calls_of_one_batch_keep_each_others_changes(inline: InMemoryDispatcher) -> None:
    together = threading.Barrier(3, timeout=10)

    def add_item(item: str, ctx: ToolContext) -> str:
        """Add an item to the shopping list."""
        together.wait()  # the three calls run at once, then each changes one shared list
        ctx.session_state.setdefault("shopping_list", []).append(item)
        ctx.session_state[f"by-{item}"] = True
        return "added"

    model = CountingModel(script=ScriptConfig(batches=[calls("add_item", "milk", "eggs", "tea")]))
    agent = Agent(name=name("together"), model=model, tools=[add_item])

    out = agent.run("add three things")

    assert out.status == S.COMPLETED and len(out.tools) == 3
    assert sorted(out.session_state["shopping_list"]) == ["eggs", "milk", "tea"]
    assert {k for k in out.session_state if k.startswith("by-")} == {"by-milk", "by-eggs", "by-tea"}


def test_a_call_that_raises_or_leaves_no_json_changes_nothing_and_the_model_reads_why(
    inline: InMemoryDispatcher,
) -> None:
    def risky(item: str, session_state: dict[str, Any]) -> str:
        """Change the state, then fail or not."""
        session_state["touched"] = item
        if item == "boom":
            raise RuntimeError("the card was declined")
        if item == "set":
            session_state["tags"] = {"a", "b"}
        return "ok"

    model = CountingModel(script=ScriptConfig(batches=[calls("risky", "boom"), calls("risky", "set")]))
    agent = Agent(name=name("risky"), model=model, tools=[risky], session_state={"touched": None})

    out = agent.run("try")

    assert [(t.result, t.tool_call_error) for t in out.tools] == [
        ("the card was declined", True),
        (
            "the session_state a tool left must hold JSON values only (str, number, bool, None, list, dict): "
            "Object of type set is not JSON serializable; the call's changes to the session state were not kept",
            True,
        ),
    ]
    assert out.session_state == {"touched": None}


def test_a_user_id_reaches_the_run_its_tools_its_session_its_members_and_its_forks(
    inline: InMemoryDispatcher,
) -> None:
    seen: list[tuple[str | None, str | None]] = []

    def note(text: str, ctx: ToolContext) -> str:
        """Note something in the session."""
        seen.append((ctx.user_id, ctx.session_id))
        ctx.session_state.setdefault("notes", []).append(text)
        return "noted"

    t = uuid.uuid4().hex[:6]
    member = Agent(
        name=f"noter-{t}", model=CountingModel(script=ScriptConfig(batches=[calls("note", "from member", key="text")])),
        tools=[note],
    )  # fmt: skip
    delegate = {"tool": TO_MEMBER, "arguments": {"member_id": member_id(member), "task": "note it"}}
    leader = CountingModel(script=ScriptConfig(batches=[[*calls("note", "from leader", key="text"), delegate]]))
    team = Team(name=f"team-{t}", model=leader, members=[member], tools=[note])

    out = team.run("go", session_id="s-team", user_id="ada")

    assert out.status == S.COMPLETED and out.user_id == "ada"
    assert [m.user_id for m in out.member_runs] == ["ada"]
    assert sorted(out.session_state["notes"]) == ["from leader", "from member"]
    assert seen == [("ada", "s-team"), ("ada", "s-team")]
    fork = inline.client.continue_run(out.run_id, input="more").wait(0)
    assert fork.run_id != out.run_id and fork.user_id == "ada"
    session = inline.client.get_session("s-team")
    assert session is not None and session.user_id == "ada"


def test_a_session_is_its_first_runs_users_and_takes_runs_only_for_that_user(inline: InMemoryDispatcher) -> None:
    agent = shopper()
    first = agent.run("one", session_id="s-ada", user_id="ada")
    for other in ("bob", None):
        with pytest.raises(SessionOwnedError, match="session 's-ada' belongs to another user"):
            agent.start("two", session_id="s-ada", user_id=other)
    second = agent.run("three", session_id="s-ada", user_id="ada")

    session = inline.client.get_session("s-ada")
    assert session is not None and session.user_id == "ada"  # the user of its first run
    assert [r.run_id for r in session.runs] == [first.run_id, second.run_id]


def test_async_calls_of_one_batch_never_wait_on_the_tool_loop_and_each_change_lands(
    inline: InMemoryDispatcher,
) -> None:
    together = asyncio.Barrier(3)

    async def mark(item: str, ctx: ToolContext) -> str:
        """Mark an item in the session."""
        await asyncio.wait_for(together.wait(), 10)  # the three coroutines run at once on the tool loop
        ctx.session_state[f"by-{item}"] = True  # a wait for a turn here would block the loop
        await asyncio.sleep(0.01)
        return "marked"

    async def add(item: str, session_state: dict[str, Any]) -> str:
        """Add an item: the state is given before the coroutine starts, in the call's turn."""
        session_state.setdefault("list", []).append(item)
        await asyncio.sleep(0.01)
        return "added"

    batches = [calls("mark", "a", "b", "c"), calls("add", "x", "y", "z")]
    agent = Agent(name=name("async"), model=CountingModel(script=ScriptConfig(batches=batches)), tools=[mark, add])

    out = agent.run("go")

    assert out.status == S.COMPLETED and [t.result for t in out.tools] == ["marked"] * 3 + ["added"] * 3
    assert {k for k in out.session_state if k.startswith("by-")} == {"by-a", "by-b", "by-c"}
    assert sorted(out.session_state["list"]) == ["x", "y", "z"]
