"""The scripted server's bodies are openai's own types: the SDK reads them back field for field."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from openai.types.shared import ErrorObject
from pydantic import ValidationError

from orchestrator.testing.replies import chat_completion, error_reply, model_list, response_object
from orchestrator.testing.script import ScriptedReply, error_body

USAGE = {"input_tokens": 12, "output_tokens": 5}
CALLS = [("call_1", "search", '{"query": "cats"}'), ("call_2", "search", '{"query": "dogs"}')]


def test_a_chat_completion_with_tool_calls_reads_back_as_the_sdk_sees_it() -> None:
    body = chat_completion("gpt-test", ScriptedReply(tool_calls=CALLS, usage=USAGE))
    completion = ChatCompletion.model_validate(body)
    (choice,) = completion.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []] == CALLS  # type: ignore[union-attr]
    assert completion.usage is not None and completion.usage.total_tokens == 17
    assert completion.model_dump(mode="json", exclude_unset=True) == body


def test_a_chat_completion_with_text_has_no_tool_calls_key() -> None:
    body = chat_completion("gpt-test", ScriptedReply(content="Summary", usage=USAGE))
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Summary", "refusal": None}
    assert body["choices"][0]["finish_reason"] == "stop"


def test_a_response_reads_back_with_its_calls_then_its_text_and_echoes_the_function_tools() -> None:
    tool = {"type": "function", "name": "search", "description": "Search.", "parameters": {}, "strict": False}
    request = {"tools": [tool, {"type": "web_search"}], "instructions": "Be brief.", "metadata": {"k": "v"}}
    body = response_object("gpt-test", ScriptedReply(content="and so", tool_calls=CALLS[:1], usage=USAGE), request)
    response = Response.model_validate(body)
    assert [item.type for item in response.output] == ["function_call", "message"]
    assert response.output_text == "and so" and response.instructions == "Be brief."
    assert [t.model_dump(exclude_unset=True) for t in response.tools] == [tool]
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens == 0
    assert response.model_dump(mode="json", exclude_unset=True) == body


def test_a_reply_of_the_wrong_shape_fails_where_it_is_built_not_in_the_client() -> None:
    not_text = [("call_1", "search", {"query": "cats"})]
    with pytest.raises(ValidationError):
        chat_completion("gpt-test", ScriptedReply(tool_calls=not_text, usage=USAGE))  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        response_object("gpt-test", ScriptedReply(tool_calls=not_text, usage=USAGE), {})  # type: ignore[arg-type]


def test_an_error_body_is_openais_envelope_around_an_error_object() -> None:
    body = error_reply(error_body(429, "slow down"))
    assert set(body) == {"error"}
    error = ErrorObject.model_validate(body["error"])
    assert (error.message, error.type, error.code) == ("slow down", "requests", "rate_limit_exceeded")


def test_the_model_list_names_each_model() -> None:
    body = model_list(["scripted", "leader"])
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["scripted", "leader"]
