"""The scripted server's Anthropic Messages API: `POST /v1/messages`, whole or streamed.

The real `anthropic` client talks to it with the server's root as its base URL
(`anthropic_base_url`), its key in `x-api-key` or as a bearer token (the SDK sends an `api_key`
that way), checked as OpenAI's is. A request is read
as the conversation `script.decide` reads (`messages_conversation`: the system prompt first, each
`tool_use` block a call of its assistant turn, each `tool_result` block a tool message), and the
answer is built from the anthropic package's own types: a `Message`, or with `stream: true` its
server-sent events (`message_start`, per content block `content_block_start`, its deltas (text a
word a delta, a call's input in `input_json_delta` fragments) and `content_block_stop`, then
`message_delta` with the stop reason and the output's usage, and `message_stop`). An error is
Anthropic's `ErrorResponse` (`{"type": "error", "error": {"type", "message"}}`), and an error
mid-stream its `error` event.

Usage: the script's input tokens less the cached half are `input_tokens` and that half
`cache_read_input_tokens` (Anthropic counts them apart); `cache_creation_input_tokens` is 0 unless
`ScriptConfig.usage_fields` says otherwise (its fields, in the API's names, go over the counts).

The anthropic package (the `anthropic` extra) is imported when a request comes, so a server that
never gets one runs without it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from orchestrator.testing.script import ScriptedError, ScriptedReply
from orchestrator.testing.streams import words

if TYPE_CHECKING:
    from anthropic.types import InputJSONDelta, Message, TextBlock, TextDelta, ToolUseBlock

#: Characters per `input_json_delta` fragment of a call's input.
INPUT_FRAGMENT = 8
#: Anthropic's error `type` per status (`anthropic.types.shared.ErrorType`).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}
#: OpenAI's error `type` or `code` (a script's `error_body`) as Anthropic's, for an error mid-stream.
_FROM_OPENAI = {
    "invalid_api_key": "authentication_error",
    "rate_limit_exceeded": "rate_limit_error",
    "overloaded": "overloaded_error",
}


def anthropic_base_url(server_url: str) -> str:
    """The base URL for `anthropic.Anthropic(base_url=...)` of a scripted server whose OpenAI
    base URL is `server_url`: its root (the client adds `/v1/messages`)."""
    return server_url.removesuffix("/v1")


class MessagesWire:
    """What the server needs of the Messages API: the request read, the answer written."""

    #: The API's name in the request log, and its path after `/v1`.
    api = "messages"
    path = "/messages"

    def conversation(self, body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The conversation and the tools (`{"name", "description", "parameters"}`) of a request."""
        tools = [
            {"name": t.get("name"), "description": t.get("description"), "parameters": t.get("input_schema")}
            for t in body.get("tools") or []
        ]
        return messages_conversation(body.get("system"), body.get("messages") or []), tools

    def api_key(self, headers: Any) -> str | None:
        """The key the client sent: in `x-api-key`, or as a bearer token (how the SDK sends an
        `api_key` it is given)."""
        if key := (headers.get("x-api-key") or "").strip():
            return key
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        return (token.strip() or None) if scheme.lower() == "bearer" else None

    def output_format_name(self, body: Mapping[str, Any]) -> str | None:
        """Anthropic's JSON schema format has no name: "json_schema" when one was asked for."""
        fmt = (body.get("output_config") or {}).get("format") or {}
        return "json_schema" if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" else None

    def reply(self, model: str, reply: ScriptedReply, usage_fields: Mapping[str, Any]) -> dict[str, Any]:
        """A whole reply: a `message` object."""
        return _json(_message(model, reply, usage_fields))

    def error(self, decision: ScriptedError) -> dict[str, Any]:
        """The error body of a scripted error status."""
        return error_response(_ERROR_TYPES.get(decision.status, _fallback(decision.status)), decision.message)

    def events(self, model: str, reply: ScriptedReply, usage_fields: Mapping[str, Any]) -> list[bytes]:
        """A streamed reply's events; cut by an `error` event when the script breaks it with an error."""
        events = message_events(model, reply, usage_fields)
        if reply.break_after is not None and reply.break_error is not None:
            error = reply.break_error["error"]
            kind = _FROM_OPENAI.get(str(error.get("code")), _FROM_OPENAI.get(str(error.get("type")), "api_error"))
            if error.get("type") == "invalid_request_error" and kind == "api_error":
                kind = "invalid_request_error"
            events = [*events[: reply.break_after], _event(error_response(kind, str(error.get("message"))))]
        return events


def messages_conversation(system: Any, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A Messages API request as the script's conversation (`orchestrator.testing.conversation`)."""
    conversation: list[dict[str, Any]] = []
    if system:
        conversation.append(_entry("system", _text(system)))
    for message in messages:
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        if message.get("role") == "assistant":
            calls = [
                {"id": b.get("id"), "name": b.get("name"), "arguments": json.dumps(b.get("input") or {})}
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            text = "".join(str(b.get("text") or "") for b in blocks if b.get("type") == "text")
            conversation.append({**_entry("assistant", text or None), "tool_calls": calls or None})
            continue
        for block in blocks:
            if block.get("type") == "tool_result":
                result = _entry("tool", _text(block.get("content")))
                conversation.append({**result, "tool_call_id": block.get("tool_use_id")})
        texts = [str(b.get("text") or "") for b in blocks if b.get("type") == "text"]
        if texts:
            conversation.append(_entry("user", "".join(texts)))
    return conversation


def message_events(model: str, reply: ScriptedReply, usage_fields: Mapping[str, Any]) -> list[bytes]:
    """A reply as the Messages API streams it, `message_start` to `message_stop`."""
    from anthropic.types import (
        InputJSONDelta,
        MessageDeltaUsage,
        RawContentBlockDeltaEvent,
        RawContentBlockStartEvent,
        RawContentBlockStopEvent,
        RawMessageDeltaEvent,
        RawMessageStartEvent,
        RawMessageStopEvent,
        TextBlock,
        TextDelta,
        ToolUseBlock,
    )
    from anthropic.types.raw_message_delta_event import Delta

    final = _message(model, reply, usage_fields)
    started = final.model_copy(update={"content": [], "stop_reason": None})
    events: list[BaseModel] = [RawMessageStartEvent(type="message_start", message=started)]
    for index, block in enumerate(final.content):
        if isinstance(block, ToolUseBlock):
            opened: TextBlock | ToolUseBlock = block.model_copy(update={"input": {}})
            deltas: list[TextDelta | InputJSONDelta] = [
                InputJSONDelta(type="input_json_delta", partial_json=piece)
                for piece in _fragments(_arguments(reply, index))
            ]
        elif isinstance(block, TextBlock):
            opened = TextBlock(type="text", text="")
            deltas = [TextDelta(type="text_delta", text=word) for word in words(block.text)]
        else:
            continue
        events.append(RawContentBlockStartEvent(type="content_block_start", index=index, content_block=opened))
        events += [RawContentBlockDeltaEvent(type="content_block_delta", index=index, delta=d) for d in deltas]
        events.append(RawContentBlockStopEvent(type="content_block_stop", index=index))
    usage = MessageDeltaUsage(output_tokens=final.usage.output_tokens)
    delta = Delta(stop_reason=final.stop_reason, stop_sequence=None)
    events += [
        RawMessageDeltaEvent(type="message_delta", delta=delta, usage=usage),
        RawMessageStopEvent(type="message_stop"),
    ]
    return [_event(_json(e)) for e in events]


def error_response(kind: str, message: str) -> dict[str, Any]:
    """Anthropic's error body, checked as an `ErrorResponse`."""
    from anthropic.types.shared import ErrorResponse

    checked = ErrorResponse.model_validate({"type": "error", "error": {"type": kind, "message": message}})
    return _json(checked)


def _message(model: str, reply: ScriptedReply, usage_fields: Mapping[str, Any]) -> Message:
    from anthropic.types import Message, TextBlock, ToolUseBlock, Usage

    content: list[TextBlock | ToolUseBlock] = []
    if reply.content is not None:
        content.append(TextBlock(type="text", text=reply.content))
    for cid, name, args in reply.tool_calls:
        content.append(ToolUseBlock(type="tool_use", id=cid, name=name, input=_input(args)))
    counts = reply.usage
    cached = counts.get("cached_tokens", 0)
    usage = {
        "input_tokens": counts["input_tokens"] - cached,
        "output_tokens": counts["output_tokens"],
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        **usage_fields,
    }
    return Message(
        id="msg_" + uuid.uuid4().hex[:24],
        type="message",
        role="assistant",
        model=model,
        content=list(content),
        stop_reason="tool_use" if reply.tool_calls else "end_turn",
        stop_sequence=None,
        # Constructed, not validated: `usage_fields` may be off-spec on purpose.
        usage=Usage.model_construct(**usage),
    )


def _arguments(reply: ScriptedReply, index: int) -> str:
    offset = 0 if reply.content is None else 1
    return reply.tool_calls[index - offset][2]


def _input(args: str) -> dict[str, Any]:
    # A whole reply's input is an object: arguments the script broke on purpose are sent streamed only.
    try:
        value = json.loads(args)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _fallback(status: int) -> str:
    return "api_error" if status >= 500 else "invalid_request_error"


def _entry(role: str, content: str | None) -> dict[str, Any]:
    return {"role": role, "content": content, "tool_calls": None, "tool_call_id": None}


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content)


def _fragments(text: str) -> list[str]:
    return [text[i : i + INPUT_FRAGMENT] for i in range(0, len(text), INPUT_FRAGMENT)]


def _json(value: BaseModel) -> dict[str, Any]:
    return value.model_dump(mode="json", exclude_unset=True)


def _event(body: Mapping[str, Any]) -> bytes:
    return f"event: {body['type']}\ndata: {json.dumps(body)}\n\n".encode()
