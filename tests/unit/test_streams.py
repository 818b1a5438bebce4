"""The scripted server's streams are openai's own event types, in each API's order, and its
stream-cutting faults fire only on streamed requests."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models.base import CallContext
from orchestrator.testing.script import Fault, ScriptConfig, ScriptedReply, ScriptState, decide, error_body
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.testing.streams import CHAT_DONE, chat_chunks, error_event, response_events, words

USAGE = {"input_tokens": 12, "output_tokens": 5}
CALLS = [("call_1", "search", '{"query": "cats and more cats"}'), ("call_2", "search", '{"query": "dogs"}')]
TEXT = ScriptedReply(content="Three cats, one dog.\n\nThat is all.", usage=USAGE)
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def chunks(events: list[bytes]) -> list[ChatCompletionChunk]:
    assert events[-1] == CHAT_DONE
    return [ChatCompletionChunk.model_validate(_data(e)) for e in events[:-1]]


def _data(event: bytes) -> Any:
    lines = event.decode().split("\n")
    assert lines[-2:] == ["", ""], "each event ends with a blank line"
    (data,) = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return json.loads(data)


def test_a_chat_stream_of_text_opens_with_the_role_then_sends_words_and_ends_with_the_usage() -> None:
    parsed = chunks(chat_chunks("gpt-test", TEXT, include_usage=True))
    first, *middle, finish, last = parsed
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in middle) == TEXT.content and len(middle) > 3
    assert finish.choices[0].finish_reason == "stop"
    assert last.choices == [] and last.usage is not None and last.usage.total_tokens == 17
    assert all(c.usage is None for c in parsed[:-1]) and len({c.id for c in parsed}) == 1


def test_a_chat_stream_sends_no_usage_unless_asked() -> None:
    events = chat_chunks("gpt-test", TEXT, include_usage=False)
    assert all("usage" not in _data(e) for e in events[:-1])
    assert chunks(events)[-1].choices[0].finish_reason == "stop"


def test_a_chat_stream_of_tool_calls_sends_each_id_and_name_once_then_its_arguments_in_fragments() -> None:
    parsed = chunks(chat_chunks("gpt-test", ScriptedReply(tool_calls=CALLS, usage=USAGE), include_usage=True))
    assert parsed[0].choices[0].delta.content is None
    fragments = [call for c in parsed if c.choices for call in c.choices[0].delta.tool_calls or []]
    for index, (cid, name, args) in enumerate(CALLS):
        mine = [f for f in fragments if f.index == index]
        assert [(f.id, f.function and f.function.name) for f in mine if f.id] == [(cid, name)]
        assert "".join(f.function.arguments or "" for f in mine if f.function) == args and len(mine) > 2
    assert parsed[-2].choices[0].finish_reason == "tool_calls"


def test_a_responses_stream_is_its_events_in_order_numbered_and_named() -> None:
    reply = ScriptedReply(content=TEXT.content, tool_calls=CALLS[:1], usage=USAGE)
    raw = response_events("gpt-test", reply, {"instructions": "Be brief."})
    events = [EVENTS.validate_python(_data(e)) for e in raw]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert all(r.startswith(f"event: {e.type}\n".encode()) for r, e in zip(raw, events, strict=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed" and events[0].response.status == "in_progress"
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert arguments == CALLS[0][2] and text == TEXT.content == final.output_text
    assert final.usage.total_tokens == 17 and final.instructions == "Be brief."


@pytest.mark.parametrize("text", ["", "one", "  leading", "trailing  ", "a  b\n\nc", " ", "x\ty "])
def test_words_put_back_together_are_the_text(text: str) -> None:
    assert "".join(words(text)) == text


def test_an_error_event_is_each_apis_shape() -> None:
    body = error_body(500, "overloaded")
    assert _data(error_event("chat", body, 3)) == {"error": body["error"]}
    event = EVENTS.validate_python(_data(error_event("responses", body, 3)))
    assert (event.type, event.message, event.sequence_number) == ("error", "overloaded", 3)


def test_a_stream_cutting_fault_fires_only_on_a_streamed_request_and_says_how_to_cut() -> None:
    config = ScriptConfig(faults=[Fault(status=200, break_stream_after=3), Fault(status=503, break_stream_after=5)])
    state = ScriptState()

    def ask(stream: bool) -> Any:
        return decide(
            config, state, model="m", api_key="k", conversation=[], tools=[], conversation_key="c", stream=stream
        )

    whole = ask(False)
    assert isinstance(whole, ScriptedReply) and whole.break_after is None
    cut, failed, fine = ask(True), ask(True), ask(True)
    assert (cut.break_after, cut.break_error) == (3, None)
    assert failed.break_after == 5 and failed.break_error == error_body(503, "scripted failure")
    assert fine.break_after is None and fine.content == cut.content


@pytest.mark.parametrize("fault", [{"status": 302}, {"status": 200, "body": "x"}])
def test_a_stream_cutting_fault_is_a_200_or_an_error_status_without_a_body(fault: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="cuts a stream"):
        Fault(break_stream_after=1, **fault)


def test_the_in_process_model_streams_its_text_a_word_at_a_time_and_returns_the_same_reply() -> None:
    model = ScriptedModel(script=ScriptConfig(final_text="Three cats, {user}, and one dog."))
    messages = [Message(role="user", content="find cats")]
    whole = model.invoke(messages, [], context=CallContext(run_id="r", seq=1))
    deltas: list[str] = []
    streamed = model.invoke(messages, [], context=CallContext(run_id="r", seq=1, on_delta=deltas.append))
    assert streamed == whole and "".join(deltas) == whole.content and len(deltas) > 3


@pytest.mark.parametrize(("status", "kind"), [(200, "APIConnectionError"), (500, "StreamError")])
def test_the_in_process_model_cuts_a_stream_as_the_adapters_report_it(status: int, kind: str) -> None:
    model = ScriptedModel(script=ScriptConfig(faults=[Fault(status=status, break_stream_after=2)]))
    messages = [Message(role="user", content="find cats")]
    deltas: list[str] = []
    context = CallContext(run_id="r", seq=1, on_delta=deltas.append)
    with pytest.raises(ModelCallError) as caught:
        model.invoke(messages, [], context=context)
    assert (caught.value.retryable, caught.value.kind, len(deltas)) == (True, kind, 2)
    assert model.invoke(messages, [], context=context).content
