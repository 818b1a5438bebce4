"""The scripted model's pure logic: turns, batches, faults, per-model scripts, keys."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models.base import CallContext, ToolSpec
from orchestrator.testing.arguments import arguments_from_schema
from orchestrator.testing.conversation import chat_conversation, responses_conversation
from orchestrator.testing.script import (
    Fault,
    ScriptConfig,
    ScriptedError,
    ScriptedReply,
    ScriptState,
    conversation_key,
    decide,
    turn_of,
)
from orchestrator.testing.scripted_model import ScriptedModel

SEARCH: dict[str, Any] = {
    "name": "search",
    "description": "Search the web.",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}, "lang": {"type": "string"}},
        "required": ["query", "limit"],
    },
}
LOOKUP: dict[str, Any] = {
    "name": "lookup",
    "description": "Look up a word.",
    "parameters": {"type": "object", "properties": {}},
}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text, "tool_calls": None, "tool_call_id": None}


def answer_tools(conversation: list[dict[str, Any]], reply: ScriptedReply, result: str = "ok") -> None:
    """Append the assistant's calls and a result per call, as the engine would."""
    calls = [{"id": cid, "name": name, "arguments": args} for cid, name, args in reply.tool_calls]
    conversation.append({"role": "assistant", "content": reply.content, "tool_calls": calls, "tool_call_id": None})
    for cid, _, _ in reply.tool_calls:
        conversation.append({"role": "tool", "content": result, "tool_calls": None, "tool_call_id": cid})


def ask(
    config: ScriptConfig,
    conversation: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    state: ScriptState | None = None,
    model: str = "scripted",
    api_key: str | None = "sk-test",
    key: str = "run-1",
) -> ScriptedReply | ScriptedError:
    return decide(
        config,
        state or ScriptState(),
        model=model,
        api_key=api_key,
        conversation=conversation,
        tools=[SEARCH] if tools is None else tools,
        conversation_key=key,
    )


def test_without_tools_the_model_answers_text_at_once() -> None:
    reply = ask(ScriptConfig(final_text="you said {user}"), [user("hello")], tools=[])
    assert isinstance(reply, ScriptedReply)
    assert reply.content == "you said hello" and reply.tool_calls == [] and reply.finish_reason == "stop"


def test_with_tools_the_first_turns_call_tools_and_the_next_answers_with_their_results() -> None:
    config = ScriptConfig(tool_batches=2)
    conversation = [user("cats")]
    for turn in (1, 2):
        reply = ask(config, conversation)
        assert isinstance(reply, ScriptedReply) and reply.turn == turn and len(reply.tool_calls) == 1
        answer_tools(conversation, reply, result=f"result {turn}")
    final = ask(config, conversation)
    assert isinstance(final, ScriptedReply) and final.turn == 3
    assert final.content == "Summary: result 1; result 2"


def test_the_final_text_says_when_no_tools_were_called() -> None:
    reply = ask(ScriptConfig(final_text="{tool_results} at turn {turn}"), [user("x")], tools=[])
    assert isinstance(reply, ScriptedReply) and reply.content == "no tools were called at turn 1"


def test_a_template_with_json_braces_is_not_a_format_error() -> None:
    reply = ask(ScriptConfig(final_text='{"answer": "{user}"}'), [user("x")], tools=[])
    assert isinstance(reply, ScriptedReply) and json.loads(reply.content or "") == {"answer": "x"}


def test_arguments_default_to_values_built_from_the_required_properties() -> None:
    reply = ask(ScriptConfig(), [user("find cats")])
    assert isinstance(reply, ScriptedReply)
    (_, name, args), *_ = reply.tool_calls
    assert name == "search" and json.loads(args) == {"query": "find cats", "limit": 1}


def test_schema_values_cover_every_json_type() -> None:
    schema = {
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "a": {"type": "array"},
            "o": {"type": "object"},
            "opt": {"type": ["null", "integer"]},
            "e": {"enum": ["red", "blue"]},
        },
        "required": ["s", "i", "n", "b", "a", "o", "opt", "e"],
    }
    assert arguments_from_schema(schema, "hi") == {
        "s": "hi",
        "i": 1,
        "n": 1.0,
        "b": True,
        "a": [],
        "o": {},
        "opt": 1,
        "e": "red",
    }


def test_the_named_tool_and_explicit_arguments_are_used() -> None:
    reply = ask(ScriptConfig(tool="lookup", arguments={"word": "cat"}), [user("x")], tools=[SEARCH, LOOKUP])
    assert isinstance(reply, ScriptedReply)
    assert [(n, json.loads(a)) for _, n, a in reply.tool_calls] == [("lookup", {"word": "cat"})]


def test_a_batch_holds_calls_per_batch_calls_with_unique_deterministic_ids() -> None:
    config = ScriptConfig(calls_per_batch=3)
    first = ask(config, [user("x")])
    again = ask(config, [user("x")])
    other = ask(config, [user("y")])
    assert isinstance(first, ScriptedReply) and isinstance(again, ScriptedReply) and isinstance(other, ScriptedReply)
    ids = [cid for cid, _, _ in first.tool_calls]
    assert len(ids) == 3 and len(set(ids)) == 3 and all(i.startswith("call_1_") for i in ids)
    assert ids == [cid for cid, _, _ in again.tool_calls]
    assert set(ids).isdisjoint(cid for cid, _, _ in other.tool_calls)


def test_an_explicit_script_overrides_batches_and_ends_with_the_final_text() -> None:
    config = ScriptConfig(
        tool_batches=5,
        batches=[
            [{"tool": "lookup", "arguments": {"word": "a"}}, {"tool": "search"}],
            [{"tool": "lookup", "arguments": {"word": "b"}}],
        ],
    )
    conversation = [user("q")]
    first = ask(config, conversation, tools=[SEARCH, LOOKUP])
    assert isinstance(first, ScriptedReply)
    assert [(n, json.loads(a)) for _, n, a in first.tool_calls] == [
        ("lookup", {"word": "a"}),
        ("search", {"query": "q", "limit": 1}),
    ]
    answer_tools(conversation, first)
    second = ask(config, conversation, tools=[SEARCH, LOOKUP])
    assert isinstance(second, ScriptedReply) and [n for _, n, _ in second.tool_calls] == ["lookup"]
    answer_tools(conversation, second)
    final = ask(config, conversation, tools=[SEARCH, LOOKUP])
    assert isinstance(final, ScriptedReply) and final.content == "Summary: ok; ok; ok"


def test_malformed_arguments_are_sent_on_the_chosen_turn_only() -> None:
    config = ScriptConfig(tool_batches=2, malformed_arguments_on_turn=2)
    conversation = [user("x")]
    first = ask(config, conversation)
    assert isinstance(first, ScriptedReply)
    json.loads(first.tool_calls[0][2])
    answer_tools(conversation, first)
    second = ask(config, conversation)
    assert isinstance(second, ScriptedReply)
    with pytest.raises(json.JSONDecodeError):
        json.loads(second.tool_calls[0][2])


def test_a_fault_fires_times_per_conversation_then_the_model_answers() -> None:
    config = ScriptConfig(faults=[Fault(status=429, times=2, retry_after=1.5)])
    state = ScriptState()
    results = [ask(config, [user("x")], state=state) for _ in range(3)]
    assert [type(r) for r in results] == [ScriptedError, ScriptedError, ScriptedReply]
    error = results[0]
    assert isinstance(error, ScriptedError) and error.status == 429 and error.retry_after == 1.5
    assert error.body["error"]["code"] == "rate_limit_exceeded"
    # Another conversation has its own budget.
    assert isinstance(ask(config, [user("x")], state=state, key="run-2"), ScriptedError)


def test_a_fault_without_a_limit_fires_forever_and_only_on_its_turn() -> None:
    config = ScriptConfig(faults=[Fault(turn=2, status=500, times=None)])
    state = ScriptState()
    conversation = [user("x")]
    first = ask(config, conversation, state=state)
    assert isinstance(first, ScriptedReply)
    answer_tools(conversation, first)
    for _ in range(5):
        error = ask(config, conversation, state=state)
        assert isinstance(error, ScriptedError) and error.status == 500 and error.turn == 2


def test_fault_budgets_hold_under_concurrent_requests() -> None:
    config = ScriptConfig(faults=[Fault(status=503, times=5)])
    state = ScriptState()
    outcomes: list[object] = []

    def call() -> None:
        outcomes.append(ask(config, [user("x")], state=state))

    threads = [threading.Thread(target=call) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(o, ScriptedError) for o in outcomes) == 5


def test_a_model_listed_in_by_model_follows_its_own_script() -> None:
    config = ScriptConfig(
        final_text="leader",
        by_model={"member": ScriptConfig(tool_batches=0, final_text="member", faults=[Fault(status=500)])},
    )
    state = ScriptState()
    assert isinstance(ask(config, [user("x")], state=state), ScriptedReply)
    assert isinstance(ask(config, [user("x")], state=state, model="member"), ScriptedError)
    member = ask(config, [user("x")], state=state, model="member")
    assert isinstance(member, ScriptedReply) and member.content == "member"


def test_rejected_and_unaccepted_keys_get_401_without_the_key_in_the_body() -> None:
    config = ScriptConfig(reject_keys=["sk-bad-123456"], accept_keys=["sk-good-123456", "sk-bad-123456"])
    for key in ("sk-bad-123456", "sk-other-123456"):
        error = ask(config, [user("x")], api_key=key)
        assert isinstance(error, ScriptedError) and error.status == 401
        assert error.body["error"]["code"] == "invalid_api_key" and key not in json.dumps(error.body)
    assert isinstance(ask(config, [user("x")], api_key="sk-good-123456"), ScriptedReply)


def test_a_missing_key_gets_401() -> None:
    error = ask(ScriptConfig(), [user("x")], api_key=None)
    assert isinstance(error, ScriptedError) and error.status == 401


def test_the_conversation_key_is_the_run_id_else_a_hash_of_the_first_user_message() -> None:
    assert conversation_key("run-9", [user("a")]) == "run-9"
    assert conversation_key(None, [user("a"), user("b")]) == conversation_key(None, [user("a")])
    assert conversation_key(None, [user("a")]) != conversation_key(None, [user("b")])


def test_responses_input_counts_each_call_group_or_assistant_message_as_one_turn() -> None:
    items = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "cats"}]},
        {"type": "function_call", "call_id": "a", "name": "search", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "search", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "1"},
        {"type": "function_call_output", "call_id": "b", "output": "2"},
        {"role": "assistant", "content": "Looking again."},
        {"type": "function_call", "call_id": "c", "name": "search", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "3"},
    ]
    conversation = responses_conversation(items, instructions="Be kind.")
    assert turn_of(conversation) == 3
    assert [m["role"] for m in conversation][:3] == ["system", "system", "user"]
    assert conversation[2]["content"] == "cats"
    assert [len(m["tool_calls"]) for m in conversation if m["role"] == "assistant"] == [2, 1]
    assert turn_of(responses_conversation("hello")) == 1


def test_chat_messages_count_each_assistant_message_as_one_turn() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "cats"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "function": {"name": "s", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": [{"type": "text", "text": "more"}]},
    ]
    conversation = chat_conversation(messages)
    assert turn_of(conversation) == 3 and conversation[-1]["content"] == "more"
    assert conversation[1]["tool_calls"] == [{"id": "a", "name": "s", "arguments": "{}"}]


def test_a_script_round_trips_through_json() -> None:
    config = ScriptConfig(faults=[Fault(status=429, retry_after=2)], by_model={"m": ScriptConfig(tool_batches=3)})
    assert ScriptConfig.model_validate_json(config.model_dump_json()) == config
    with pytest.raises(ValueError):
        ScriptConfig.model_validate({"tool_batch": 2})


def tool_spec() -> ToolSpec:
    return ToolSpec(name=SEARCH["name"], description=SEARCH["description"], parameters=SEARCH["parameters"])


def test_the_in_process_model_calls_a_tool_then_answers() -> None:
    model = ScriptedModel(script=ScriptConfig(final_text="done: {tool_results}"))
    context = CallContext(run_id="r", seq=1)
    messages = [Message(role="user", content="cats")]
    first = model.invoke(messages, [tool_spec()], context=context)
    assert [c.name for c in first.tool_calls] == ["search"] and first.usage["output_tokens"] > 0
    messages += [first.to_message(), Message(role="tool", tool_call_id=first.tool_calls[0].id, content="3 cats")]
    assert model.invoke(messages, [tool_spec()], context=context).content == "done: 3 cats"


@pytest.mark.parametrize(
    ("status", "retryable", "kind"),
    [(429, True, "RateLimitError"), (500, True, "InternalServerError"), (400, False, "BadRequestError")],
)
def test_the_in_process_model_raises_faults_classified_like_the_openai_adapters(
    status: int, retryable: bool, kind: str
) -> None:
    model = ScriptedModel(script=ScriptConfig(faults=[Fault(status=status, retry_after=3)]))
    with pytest.raises(ModelCallError) as caught:
        model.invoke([Message(role="user", content="x")], [], context=CallContext(run_id="r", seq=1))
    assert (caught.value.retryable, caught.value.kind, caught.value.status_code) == (retryable, kind, status)
    assert caught.value.retry_after == 3


def test_the_in_process_model_rejects_a_key_the_script_refuses() -> None:
    model = ScriptedModel(script=ScriptConfig(accept_keys=["right"]), api_key="wrong")
    with pytest.raises(ModelCallError) as caught:
        model.invoke([Message(role="user", content="x")], [], context=CallContext(run_id="r", seq=1))
    assert caught.value.kind == "AuthenticationError" and not caught.value.retryable
