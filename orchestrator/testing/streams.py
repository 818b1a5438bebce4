"""The scripted server's streamed replies: server-sent events as each API sends them, built from
the openai package's own types (as `orchestrator.testing.replies` builds whole replies).

Chat Completions: `chat.completion.chunk`s, the first with the role, then the text in several
deltas or each tool call as its id and name followed by its arguments in fragments, then the
finish reason; with `stream_options.include_usage` every chunk has `usage: null` and one last
chunk with no choices carries it; then `data: [DONE]`. Responses: `response.created`, then per
output item `response.output_item.added`, its deltas and its `.done` events, then
`response.completed` with the whole response (and its usage). Each event is one `data:` line
(Responses: after its `event:` line), as the real APIs send them.
"""

from __future__ import annotations

import itertools
import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import (
    Choice,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
)
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseErrorEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from pydantic import BaseModel

from orchestrator.testing.replies import chat_usage, error_reply, response_model
from orchestrator.testing.script import ScriptedReply

#: The last event of a Chat Completions stream.
CHAT_DONE = b"data: [DONE]\n\n"
#: Characters per fragment of a tool call's arguments.
ARGUMENTS_FRAGMENT = 8
# A word with the spaces before it: text goes out a word a delta, as a tokenizer would cut it.
_WORD = re.compile(r"\s*\S+\s*$|\s*\S+")


def chat_chunks(
    model: str, reply: ScriptedReply, *, include_usage: bool, usage_fields: Mapping[str, Any] | None = None
) -> list[bytes]:
    """A reply as a Chat Completions stream: its events, `[DONE]` last. `usage_fields`: sent as
    given in the usage chunk (`ScriptConfig.usage_fields`)."""
    ident, created = "chatcmpl-" + uuid.uuid4().hex[:24], int(time.time())
    # With include_usage, `usage` is null in every chunk but the last, as OpenAI sends it.
    nulls: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(delta: ChoiceDelta, finish: Literal["stop", "tool_calls"] | None = None) -> bytes:
        choice = Choice(index=0, delta=delta, finish_reason=finish, logprobs=None)
        return _data(
            ChatCompletionChunk(
                id=ident,
                object="chat.completion.chunk",
                created=created,
                model=model,
                system_fingerprint=None,
                choices=[choice],
                **nulls,
            )
        )

    if reply.tool_calls:
        events = [chunk(ChoiceDelta(role="assistant", content=None, refusal=None))]
        for index, (cid, name, args) in enumerate(reply.tool_calls):
            head = ChoiceDeltaToolCallFunction(name=name, arguments="")
            events.append(chunk(_calls(ChoiceDeltaToolCall(index=index, id=cid, type="function", function=head))))
            for piece in _fragments(args):
                tail = ChoiceDeltaToolCall(index=index, function=ChoiceDeltaToolCallFunction(arguments=piece))
                events.append(chunk(_calls(tail)))
    else:
        events = [chunk(ChoiceDelta(role="assistant", content="", refusal=None))]
        events += [chunk(ChoiceDelta(content=word)) for word in words(reply.content or "")]
    events.append(chunk(ChoiceDelta(), finish=reply.finish_reason))
    if include_usage:
        last = ChatCompletionChunk(
            id=ident,
            object="chat.completion.chunk",
            created=created,
            model=model,
            choices=[],
            usage=chat_usage(reply.usage),
        )
        body = last.model_dump(mode="json", exclude_unset=True)
        events.append(_data_of({**body, "usage": {**body["usage"], **(usage_fields or {})}}))
    return [*events, CHAT_DONE]


def response_events(
    model: str, reply: ScriptedReply, request: Mapping[str, Any], *, usage_fields: Mapping[str, Any] | None = None
) -> list[bytes]:
    """A reply as a Responses stream: `response.created` to `response.completed`. `usage_fields`:
    sent as given in the completed response's usage (`ScriptConfig.usage_fields`)."""
    final = response_model(model, reply, request)
    started = final.model_copy(update={"status": "in_progress", "output": [], "usage": None, "completed_at": None})
    numbers = itertools.count()
    events: list[BaseModel] = [
        ResponseCreatedEvent(type="response.created", response=started, sequence_number=next(numbers)),
        ResponseInProgressEvent(type="response.in_progress", response=started, sequence_number=next(numbers)),
    ]
    for index, item in enumerate(final.output):
        if isinstance(item, ResponseFunctionToolCall):
            events += _function_call_events(index, item, numbers)
        elif isinstance(item, ResponseOutputMessage):
            events += _message_events(index, item, numbers)
    completed = ResponseCompletedEvent(type="response.completed", response=final, sequence_number=next(numbers))
    body = completed.model_dump(mode="json", exclude_unset=True)
    body["response"]["usage"] = {**body["response"]["usage"], **(usage_fields or {})}
    return [*(_data(event, named=True) for event in events), f"event: {completed.type}\n".encode() + _data_of(body)]


def error_event(api: str, body: Mapping[str, Any], sequence_number: int) -> bytes:
    """The event a provider failing mid-reply sends, for OpenAI's error `body`: Chat's is an
    `error` object where a chunk would be; Responses' is an `error` event."""
    error = body["error"]
    if api == "chat":
        return _data_of(error_reply(body))
    event = ResponseErrorEvent(
        type="error",
        code=error["code"],
        message=error["message"],
        param=error["param"],
        sequence_number=sequence_number,
    )
    return _data(event, named=True)


def words(text: str) -> list[str]:
    """`text` cut into words, each with the spaces before it (the last also with those after)."""
    return _WORD.findall(text) or ([text] if text else [])


def _function_call_events(index: int, item: ResponseFunctionToolCall, numbers: Iterator[int]) -> Iterator[BaseModel]:
    opened = item.model_copy(update={"arguments": "", "status": "in_progress"})
    yield ResponseOutputItemAddedEvent(
        type="response.output_item.added", item=opened, output_index=index, sequence_number=next(numbers)
    )
    where: dict[str, Any] = {"item_id": item.id or "", "output_index": index}
    for piece in _fragments(item.arguments):
        yield ResponseFunctionCallArgumentsDeltaEvent(
            type="response.function_call_arguments.delta", delta=piece, sequence_number=next(numbers), **where
        )
    yield ResponseFunctionCallArgumentsDoneEvent(
        type="response.function_call_arguments.done", arguments=item.arguments, sequence_number=next(numbers), **where
    )
    yield ResponseOutputItemDoneEvent(
        type="response.output_item.done", item=item, output_index=index, sequence_number=next(numbers)
    )


def _message_events(index: int, item: ResponseOutputMessage, numbers: Iterator[int]) -> Iterator[BaseModel]:
    opened = item.model_copy(update={"content": [], "status": "in_progress"})
    yield ResponseOutputItemAddedEvent(
        type="response.output_item.added", item=opened, output_index=index, sequence_number=next(numbers)
    )
    for content_index, part in enumerate(item.content):
        if not isinstance(part, ResponseOutputText):
            continue
        where: dict[str, Any] = {"item_id": item.id, "output_index": index, "content_index": content_index}
        empty = ResponseOutputText(type="output_text", text="", annotations=[])
        yield ResponseContentPartAddedEvent(
            type="response.content_part.added", part=empty, sequence_number=next(numbers), **where
        )
        for word in words(part.text):
            yield ResponseTextDeltaEvent(
                type="response.output_text.delta", delta=word, logprobs=[], sequence_number=next(numbers), **where
            )
        yield ResponseTextDoneEvent(
            type="response.output_text.done", text=part.text, logprobs=[], sequence_number=next(numbers), **where
        )
        yield ResponseContentPartDoneEvent(
            type="response.content_part.done", part=part, sequence_number=next(numbers), **where
        )
    yield ResponseOutputItemDoneEvent(
        type="response.output_item.done", item=item, output_index=index, sequence_number=next(numbers)
    )


def _calls(call: ChoiceDeltaToolCall) -> ChoiceDelta:
    return ChoiceDelta(tool_calls=[call])


def _fragments(text: str) -> list[str]:
    return [text[i : i + ARGUMENTS_FRAGMENT] for i in range(0, len(text), ARGUMENTS_FRAGMENT)]


def _data(value: BaseModel, *, named: bool = False) -> bytes:
    body = value.model_dump(mode="json", exclude_unset=True)
    return (f"event: {body['type']}\n" if named else "").encode() + _data_of(body)


def _data_of(body: Mapping[str, Any]) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()
