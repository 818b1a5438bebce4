"""Session state as values: what a call changed (top-level keys set and removed), applied to a
state; what can be stored; a batch's turns."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from orchestrator import Agent, state
from orchestrator.errors import ConfigurationError, InvalidInputError
from orchestrator.state import STATE_MAX_BYTES, CallState, StateChange, StateError, Turn
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.tools import Tool, ToolContext
from orchestrator.validation import session_state


def test_a_change_is_the_top_level_keys_set_and_removed() -> None:
    before = {"cart": ["milk"], "count": 1, "gone": True, "same": {"a": 1}}
    after = {"cart": ["milk", "eggs"], "count": 1, "same": {"a": 1}, "new": None}

    change = StateChange.between(before, after)

    assert change == StateChange(set={"cart": ["milk", "eggs"], "new": None}, removed=("gone",))
    assert StateChange.between(before, dict(before)) is None


def test_a_change_leaves_the_keys_it_did_not_touch_as_others_wrote_them() -> None:
    stored_meanwhile = {"cart": ["milk"], "theirs": 2, "gone": True}
    change = StateChange(set={"mine": 1}, removed=("gone", "never-there"))

    assert change.applied_to(stored_meanwhile) == {"cart": ["milk"], "theirs": 2, "mine": 1}
    assert state.apply({"a": 1}, [StateChange(set={"a": 2}), StateChange(set={"b": 3}, removed=("a",))]) == {"b": 3}


def test_defaults_fill_only_the_keys_a_state_lacks() -> None:
    assert state.with_defaults({"cart": ["x"]}, {"cart": [], "currency": "EUR"}) == {"cart": ["x"], "currency": "EUR"}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (["a"], "must be a dict (a JSON object), not list"),
        ({1: "a"}, "keys must be strings"),
        ({"when": {1, 2}}, "JSON values only"),
        ({"x": float("nan")}, "JSON values only"),
        ({"big": "x" * STATE_MAX_BYTES}, f"the limit is {STATE_MAX_BYTES} bytes"),
    ],
)
def test_a_producer_state_that_cannot_be_stored_is_refused_saying_why(value: Any, words: str) -> None:
    with pytest.raises(InvalidInputError, match="session_state") as caught:
        session_state(value)
    assert words in str(caught.value)


def test_a_producer_state_reads_back_as_stored() -> None:
    given = {"pair": (1, 2), "nested": {"ok": [True, None]}}
    assert session_state(given) == {"pair": [1, 2], "nested": {"ok": [True, None]}}


def test_an_agent_default_state_that_cannot_be_stored_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="stateful-bad: session_state must hold JSON values only"):
        Agent(name="stateful-bad", model=ScriptedModel(), session_state={"when": object()})


def test_a_call_reads_the_state_once_and_its_change_is_what_it_left() -> None:
    reads: list[int] = []

    def load() -> dict[str, Any]:
        reads.append(1)
        return {"cart": ["milk"]}

    view = CallState(load)
    assert view.change() is None and not view.opened  # untouched: no read
    view.open()["cart"].append("eggs")
    view.open()["seen"] = True

    assert reads == [1]
    assert view.change() == StateChange(set={"cart": ["milk", "eggs"], "seen": True})


def test_a_call_that_leaves_something_not_json_in_the_state_gets_a_state_error() -> None:
    view = CallState(dict)
    view.open()["when"] = {1, 2}

    with pytest.raises(StateError, match="the session_state a tool left must hold JSON values only"):
        view.change()


def test_the_calls_of_a_batch_take_turns_until_each_releases_and_none_waits_once_it_ends() -> None:
    turn = Turn()
    first, second, third = CallState(dict, turn), CallState(dict, turn), CallState(dict, turn)
    first.open()
    opened = threading.Event()
    waiter = threading.Thread(target=lambda: (second.open(), opened.set()))
    waiter.start()

    assert not opened.wait(0.1)  # the second call waits for the first's turn
    first.release()
    assert opened.wait(5)
    waiter.join(5)

    late = threading.Thread(target=third.open)
    late.start()
    turn.end()  # the batch is ending while the second still holds the turn: the third goes on
    late.join(5)
    assert not late.is_alive()
    second.release()
    third.release()  # it never had the turn: nothing to hand on


def test_a_tool_parameter_named_session_state_is_given_the_state_and_not_shown_to_the_model() -> None:
    def add_item(item: str, session_state: dict[str, Any]) -> str:
        """Add an item to the list."""
        session_state.setdefault("items", []).append(item)
        return f"{len(session_state['items'])} items"

    added = Tool(add_item)
    context = ToolContext(run_id="r", tool_call_id="c")

    assert list(added.spec.parameters["properties"]) == ["item"]
    assert added.call({"item": "milk"}, context) == "1 items"
    assert context.session_state == {"items": ["milk"]}
    assert context.state.change() == StateChange(set={"items": ["milk"]})


def test_a_context_annotated_optional_is_the_engines_to_pass_too() -> None:
    def probe(query: str, ctx: ToolContext | None = None) -> str:
        """Probe."""
        return query

    assert list(Tool(probe).spec.parameters["properties"]) == ["query"]
