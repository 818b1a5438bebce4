"""The scripted server's bodies, built from the openai package's own types.

Each reply is constructed as the type the SDK reads it into (`ChatCompletion`, `Response`, ...),
then dumped as JSON: a field the type lacks fails the type check (mypy reads the constructors'
keywords), and a value of the wrong shape fails at construction, in the server, instead of
reaching a client as a reply that only looks right. `exclude_unset` leaves out what the server
did not set, as a provider omits it.

Bodies that are deliberately not a reply (a `Fault` with a `body`: a proxy's HTML page, a 200
that is not JSON) are not built here: the server sends their text as it is.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from openai.types import Model
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageToolCallUnion,
)
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.completion_usage import CompletionTokensDetails, CompletionUsage, PromptTokensDetails
from openai.types.responses import (
    FunctionTool,
    Response,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from openai.types.shared import ErrorObject
from pydantic import BaseModel

from orchestrator.testing.script import ScriptedReply


def chat_completion(model: str, reply: ScriptedReply) -> dict[str, Any]:
    """A `chat.completion` object for a reply."""
    calls: list[ChatCompletionMessageToolCallUnion] = [
        ChatCompletionMessageFunctionToolCall(id=cid, type="function", function=Function(name=name, arguments=args))
        for cid, name, args in reply.tool_calls
    ]
    # A reply without calls has no tool_calls key (unset, not null), as OpenAI sends it.
    message = (
        ChatCompletionMessage(role="assistant", content=reply.content, refusal=None, tool_calls=calls)
        if calls
        else ChatCompletionMessage(role="assistant", content=reply.content, refusal=None)
    )
    usage = reply.usage
    return _json(
        ChatCompletion(
            id="chatcmpl-" + uuid.uuid4().hex[:24],
            object="chat.completion",
            created=int(time.time()),
            model=model,
            system_fingerprint=None,
            choices=[Choice(index=0, message=message, finish_reason=reply.finish_reason, logprobs=None)],
            usage=chat_usage(usage),
        )
    )


def response_object(model: str, reply: ScriptedReply, request: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses API `response` object for a reply, echoing the request's settings as the API does."""
    return _json(response_model(model, reply, request))


def response_model(model: str, reply: ScriptedReply, request: Mapping[str, Any]) -> Response:
    """The `Response` of `response_object`, before it is dumped (a stream sends it in pieces)."""
    output: list[ResponseOutputItem] = [
        ResponseFunctionToolCall(
            type="function_call", id="fc_" + cid, call_id=cid, name=name, arguments=args, status="completed"
        )
        for cid, name, args in reply.tool_calls
    ]
    if reply.content is not None:
        text = ResponseOutputText(type="output_text", text=reply.content, annotations=[])
        output.append(
            ResponseOutputMessage(
                type="message", id="msg_" + uuid.uuid4().hex[:24], role="assistant", status="completed", content=[text]
            )
        )
    usage = reply.usage
    now = time.time()
    return Response(
        id="resp_" + uuid.uuid4().hex[:24],
        object="response",
        created_at=now,
        completed_at=now,
        status="completed",
        model=model,
        output=output,
        error=None,
        incomplete_details=None,
        instructions=request.get("instructions"),
        metadata=request.get("metadata") or {},
        parallel_tool_calls=bool(request.get("parallel_tool_calls", True)),
        temperature=request.get("temperature"),
        top_p=request.get("top_p"),
        tool_choice=request.get("tool_choice") or "auto",
        tools=list(_function_tools(request.get("tools") or [])),
        previous_response_id=None,
        usage=ResponseUsage(
            input_tokens=usage["input_tokens"],
            output_tokens=usage["output_tokens"],
            total_tokens=usage["input_tokens"] + usage["output_tokens"],
            input_tokens_details=InputTokensDetails(cached_tokens=usage.get("cached_tokens", 0), cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.get("reasoning_tokens", 0)),
        ),
    )


def chat_usage(usage: Mapping[str, int]) -> CompletionUsage:
    """A Chat Completions `usage` for a reply's usage (a stream sends it in its last chunk)."""
    tokens_in, tokens_out = usage["input_tokens"], usage["output_tokens"]
    return CompletionUsage(
        prompt_tokens=tokens_in,
        completion_tokens=tokens_out,
        total_tokens=tokens_in + tokens_out,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=usage.get("cached_tokens", 0)),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=usage.get("reasoning_tokens", 0)),
    )


def error_reply(body: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI's error envelope for a `script.error_body`, its `error` checked as an `ErrorObject`."""
    error = body["error"]
    checked = ErrorObject(message=error["message"], type=error["type"], param=error["param"], code=error["code"])
    return {"error": _json(checked)}


def model_list(ids: Iterable[str]) -> dict[str, Any]:
    """The `GET /models` list: one `Model` per id."""
    return {
        "object": "list",
        "data": [_json(Model(id=i, object="model", created=0, owned_by="ratchet")) for i in ids],
    }


def _function_tools(tools: Iterable[Mapping[str, Any]]) -> Iterable[FunctionTool]:
    # The function tools the script saw, echoed back as the API does (it answers no other kind).
    for t in tools:
        if t.get("type") == "function":
            yield FunctionTool(
                type="function",
                name=t["name"],
                description=t.get("description"),
                parameters=t.get("parameters"),
                strict=t.get("strict"),
            )


def _json(value: BaseModel) -> dict[str, Any]:
    return value.model_dump(mode="json", exclude_unset=True)
