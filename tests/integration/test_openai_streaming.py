"""Streamed model calls: both OpenAI adapters with `CallContext.on_delta`, through the real openai
client, against the scripted server's server-sent events on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models._openai import OpenAIModel
from orchestrator.models.base import CallContext, ModelReply, ToolSpec
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.models.openai_responses import OpenAIResponses
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from tests.servers import fresh_server

GOOD_KEY = "sk-test-good-0123456789abcdef"
SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
LONG_ANSWER = "Here is what the search found about {user}, told one word at a time as a model writes it."
#: A script that answers with text at once, though a tool is offered.
TEXT = ScriptConfig(final_text=LONG_ANSWER, tool_batches=0)


@pytest.fixture
def server(scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> ScriptedServer:
    env, unset = {"OPENAI_API_KEY": GOOD_KEY}, ["OPENAI_BASE_URL"]
    return fresh_server(scripted_server, monkeypatch, ScriptConfig(final_text=LONG_ANSWER), env=env, unset=unset)


@pytest.fixture(params=[OpenAIChat, OpenAIResponses], ids=lambda cls: cls.__name__)
def adapter(request: pytest.FixtureRequest) -> type[OpenAIModel]:
    return request.param  # type: ignore[no-any-return]


def ask(
    model: OpenAIModel,
    messages: list[Message],
    *,
    on_delta: Callable[[str], None] | None = None,
    run_id: str = "run-1",
    timeout: float | None = None,
) -> ModelReply:
    context = CallContext(run_id=run_id, seq=1, on_delta=on_delta, timeout=timeout)
    return model.invoke(messages, [SEARCH], context=context)


def question(text: str = "find cats") -> list[Message]:
    return [Message(role="system", content="Be brief."), Message(role="user", content=text)]


def after_the_tools(model: OpenAIModel) -> list[Message]:
    """A conversation whose tool calls are answered: the next reply is the final text."""
    messages = question()
    first = ask(model, messages, run_id="setup")
    results = [Message(role="tool", tool_call_id=c.id, content="3 cats") for c in first.tool_calls]
    return [*messages, first.to_message(), *results]


# ---------------------------------------------------------------- the same reply, in pieces


def test_a_streamed_text_reply_arrives_in_deltas_that_make_up_the_reply_a_whole_call_returns(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    model = adapter("gpt-test", base_url=server.url)
    messages = after_the_tools(model)
    whole = ask(model, messages)
    deltas: list[str] = []
    streamed = ask(model, messages, on_delta=deltas.append)
    assert streamed == whole and whole.content is not None and whole.content.startswith("Here is what")
    assert len(deltas) > 5 and "".join(deltas) == streamed.content
    assert streamed.usage["input_tokens"] > 0 and streamed.usage["output_tokens"] > 0


def test_streamed_tool_calls_come_back_whole_with_their_ids_names_arguments_and_usage(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    arguments = {"query": "cats and dogs and a much longer query than one fragment holds"}
    server.configure(ScriptConfig(calls_per_batch=3, arguments=arguments))
    model = adapter("gpt-test", base_url=server.url)
    whole = ask(model, question())
    deltas: list[str] = []
    streamed = ask(model, question(), on_delta=deltas.append)
    assert streamed == whole and streamed.content is None and deltas == []
    assert [(c.name, json.loads(c.arguments)) for c in streamed.tool_calls] == [("search", arguments)] * 3
    assert len({c.id for c in streamed.tool_calls}) == 3 and streamed.usage == whole.usage


def test_a_streamed_call_asks_for_a_stream_and_a_whole_call_does_not(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    model = adapter("gpt-test", base_url=server.url)
    ask(model, question())
    ask(model, question(), on_delta=lambda _: None)
    whole, streamed = server.requests
    assert (whole["stream"], streamed["stream"]) == (False, True)
    assert "stream" not in whole["params"] and "stream" in streamed["params"]
    if adapter is OpenAIChat:
        assert "stream_options" in streamed["params"], "Chat sends usage in the last chunk only when asked"


def test_deltas_are_handed_over_as_they_arrive_not_when_the_reply_is_complete(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    server.configure(TEXT.model_copy(update={"chunk_delay_s": 0.02}))
    model = adapter("gpt-test", base_url=server.url)
    arrivals: list[float] = []
    ask(model, question(), on_delta=lambda _: arrivals.append(time.monotonic()))
    returned = time.monotonic()
    # The first delta came strictly before the last, and the last before the call returned: the
    # reply was handed over piece by piece while the server was still writing it.
    assert len(arrivals) > 5 and arrivals == sorted(arrivals) and arrivals[0] < arrivals[-1] <= returned


# ---------------------------------------------------------------- the SDK's own stream readers


def test_the_chat_stream_is_what_the_sdks_own_stream_helper_reads_as_the_whole_completion(
    server: ScriptedServer,
) -> None:
    client = openai.OpenAI(base_url=server.url, api_key=GOOD_KEY, max_retries=0)
    server.configure(ScriptConfig(calls_per_batch=2))
    tools: Any = [{"type": "function", "function": {"name": "search", "parameters": SEARCH.parameters}}]
    messages: Any = [{"role": "user", "content": "find cats"}]
    whole = client.chat.completions.create(model="gpt-test", messages=messages, tools=tools)
    with client.chat.completions.stream(
        model="gpt-test", messages=messages, tools=tools, stream_options={"include_usage": True}
    ) as stream:
        final = stream.get_final_completion()
    calls = [(c.id, c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
    expected = [(c.id, c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]  # type: ignore[union-attr]
    assert calls == expected and len(calls) == 2
    assert final.choices[0].finish_reason == "tool_calls" and final.usage == whole.usage


def test_the_responses_stream_is_what_the_sdks_own_stream_helper_reads_as_the_whole_response(
    server: ScriptedServer,
) -> None:
    client = openai.OpenAI(base_url=server.url, api_key=GOOD_KEY, max_retries=0)
    with client.responses.stream(model="gpt-test", input="find cats") as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(texts) and len(texts) > 5
    assert final.usage is not None and final.usage.output_tokens > 0


# ---------------------------------------------------------------- failures


def test_a_stream_cut_mid_way_is_a_retryable_error_and_the_retry_gets_the_whole_reply(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    server.configure(TEXT.model_copy(update={"faults": [Fault(status=200, break_stream_after=7)]}))
    model = adapter("gpt-test", base_url=server.url)
    deltas: list[str] = []
    with pytest.raises(ModelCallError) as caught:
        ask(model, question(), on_delta=deltas.append)
    error = caught.value
    assert (error.retryable, error.kind) == (True, "APIConnectionError")
    assert 0 < len(deltas) < 7, "the deltas before the cut were handed over"
    retried: list[str] = []
    reply = ask(model, question(), on_delta=retried.append)
    assert "".join(retried) == reply.content and reply.content and reply.content.startswith("Here is what")


def test_a_stream_cut_in_the_middle_of_a_tool_call_is_retryable(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=200, break_stream_after=3)]))
    error = _failure(adapter("gpt-test", base_url=server.url), on_delta=lambda _: None)
    assert (error.retryable, error.kind) == (True, "APIConnectionError")


def test_an_error_event_mid_stream_is_retryable_like_a_server_error(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    fault = Fault(status=500, break_stream_after=5, message="the model is overloaded")
    server.configure(TEXT.model_copy(update={"faults": [fault]}))
    model = adapter("gpt-test", base_url=server.url)
    error = _failure(model, on_delta=lambda _: None)
    assert (error.retryable, error.kind) == (True, "StreamError") and "the model is overloaded" in str(error)
    assert ask(model, question(), on_delta=lambda _: None).content


def test_an_error_before_the_stream_starts_keeps_its_classification(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=429, retry_after=3), Fault(status=401)]))
    model = adapter("gpt-test", base_url=server.url)
    limited = _failure(model, on_delta=lambda _: None)
    assert (limited.retryable, limited.kind, limited.status_code, limited.retry_after) == (
        True,
        "RateLimitError",
        429,
        3.0,
    )
    denied = _failure(model, on_delta=lambda _: None)
    assert (denied.retryable, denied.kind, denied.status_code) == (False, "AuthenticationError", 401)


def test_a_fault_that_cuts_streams_leaves_a_whole_call_alone(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=200, break_stream_after=2)]))
    model = adapter("gpt-test", base_url=server.url)
    assert ask(model, question()).tool_calls
    assert _failure(model, on_delta=lambda _: None).retryable, "its budget was still there for the stream"


UNFINISHED = {
    OpenAIChat: 'data: {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", '
    '"choices": [{"index": 0, "delta": {"content": "Hel"}, "finish_reason": null}]}\n\n',
    OpenAIResponses: 'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", '
    '"delta": "Hel", "item_id": "m", "output_index": 0, "content_index": 0, "logprobs": [], "sequence_number": 0}\n\n',
}


def test_a_stream_that_ends_before_its_reply_does_is_a_retryable_malformed_reply(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    # The body ends cleanly, but without Chat's finish_reason or Responses' response.completed.
    fault = Fault(status=200, body=UNFINISHED[adapter], content_type="text/event-stream")
    server.configure(ScriptConfig(faults=[fault]))
    deltas: list[str] = []
    error = _failure(adapter("gpt-test", base_url=server.url), on_delta=deltas.append)
    assert (error.retryable, error.kind, deltas) == (True, "MalformedReply", ["Hel"])


def test_a_stream_event_that_is_not_json_is_a_retryable_malformed_reply(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    server.configure(
        ScriptConfig(faults=[Fault(status=200, body="data: <html>\n\n", content_type="text/event-stream")])
    )
    error = _failure(adapter("gpt-test", base_url=server.url), on_delta=lambda _: None)
    assert (error.retryable, error.kind) == (True, "MalformedReply") and "not JSON" in str(error)


@pytest.mark.parametrize(
    "chunk",
    [
        "[1, 2]",  # not an object
        '{"choices": "none"}',  # choices not a list of objects
        '{"choices": [{"index": 0, "delta": "Hel"}]}',  # a delta that is not an object
        '{"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "first"}]}}]}',  # an index not a number
    ],
)
def test_a_chat_chunk_of_the_wrong_shape_is_a_retryable_malformed_reply(server: ScriptedServer, chunk: str) -> None:
    # Chat chunks are read as the JSON the server sent (`ChatStreamReader`): a part of the wrong
    # type is a malformed reply that names what was wrong, never a crash of the step.
    server.configure(
        ScriptConfig(faults=[Fault(status=200, body=f"data: {chunk}\n\n", content_type="text/event-stream")])
    )
    error = _failure(OpenAIChat("gpt-test", base_url=server.url), on_delta=lambda _: None)
    assert (error.retryable, error.kind) == (True, "MalformedReply"), error
    assert "not a JSON object" in str(error) or "not a number" in str(error)


def test_a_usage_that_is_not_an_object_is_unknown_streamed_as_whole_not_a_failed_reply(server: ScriptedServer) -> None:
    # A bad count is unknown, never a failed step (`orchestrator.usage`): a whole `usage` that is
    # no object too, as a whole reply's is.
    chunks = [
        {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]},
        {"id": "c", "model": "m", "choices": [], "usage": "many"},
    ]
    body = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    server.configure(ScriptConfig(faults=[Fault(status=200, body=body, content_type="text/event-stream")]))

    reply = ask(OpenAIChat("gpt-test", base_url=server.url), question(), on_delta=lambda _: None)

    assert (reply.content, reply.usage, reply.finish_reason) == ("Hi", {}, "stop")


def test_a_stream_slower_than_the_timeout_ends_as_a_retryable_timeout_within_about_it(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    # Every event comes sooner than the timeout, but the whole reply would take some 4 s.
    server.configure(TEXT.model_copy(update={"chunk_delay_s": 0.2}))
    model = adapter("gpt-test", base_url=server.url)
    ask(model, question())  # the SDK is imported and the connection is open
    started = time.monotonic()
    error = _failure(model, on_delta=lambda _: None, timeout=1.0)
    assert (error.retryable, error.kind) == (True, "APITimeoutError")
    assert time.monotonic() - started < 3.0, "the whole-call deadline bounds a stream too"


def test_an_exception_from_on_delta_is_the_callers_and_the_next_call_still_works(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    class Full(Exception):
        """What a caller's publisher might raise."""

    def refuse(_: str) -> None:
        raise Full

    server.configure(TEXT)
    model = adapter("gpt-test", base_url=server.url)
    with pytest.raises(Full):
        ask(model, question(), on_delta=refuse)
    deltas: list[str] = []
    reply = ask(model, question(), on_delta=deltas.append)
    assert "".join(deltas) == reply.content


def _failure(model: OpenAIModel, *, text: str = "find cats", **kwargs: Any) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        ask(model, question(text), **kwargs)
    return caught.value
