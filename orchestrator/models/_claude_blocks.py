"""The transcript in Anthropic's Messages API shape and back: what `Claude` sends and reads.

The stored transcript keeps Agno's fields (`orchestrator.messages`), whatever model wrote it, so a
run begun on one provider reads right on another. Here it becomes the Messages API's blocks: the
system messages go apart, in `system`; an assistant message is its text block and one `tool_use`
block per call (the arguments, JSON text in the transcript, an object here); tool results are
`tool_result` blocks in a user turn, and consecutive turns of one role are merged into one
(a tool batch's results, or results followed by the next user message), as the API wants turns
to alternate.

A reply, whole or streamed, is read from the JSON the server sent (`orchestrator.models._json`):
its text blocks joined, its `tool_use` blocks as the batch's calls (several in one reply are a
parallel batch), its usage as `ModelReply.usage` counts it (`claude_usage`). A reply that stopped
on `max_tokens` in the middle of a tool call is refused as final (`truncated_call`): its calls'
arguments are cut, and asking again with the same limit stops at the same place. So is one cut
short before any text (TruncatedReply) and a refusal (ReplyBlocked), as Gemini's adapter refuses
the same (`refuse_unusable`): an empty answer must not complete a run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message, ToolCall
from orchestrator.models._json import json_list, json_object, member
from orchestrator.models._streaming import PartialCall, StreamReader
from orchestrator.models.base import Model, ModelReply, ToolSpec
from orchestrator.usage import count

#: The stop reasons of a reply that was cut, not finished.
CUT_SHORT = frozenset({"max_tokens", "model_context_window_exceeded"})


def system_param(messages: Sequence[Message], *, cache: bool) -> str | list[dict[str, Any]] | None:
    """The `system` parameter: every system message's text, joined; as one text block marked for
    the prompt cache when `cache` (Agno's `cache_system_prompt`). None without a system message."""
    text = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    if not text:
        return None
    if not cache:
        return text
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


def messages_param(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The `messages` parameter: the transcript without its system messages, as alternating
    user and assistant turns of content blocks."""
    turns: list[dict[str, Any]] = []
    for message in messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": message.tool_call_id or "",
            "content": message.content or "",
        }
        if message.tool_call_error:
            result["is_error"] = True
        return [result]
    # The API refuses an empty text block: a reply of calls alone has none.
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
    if message.role == "assistant":
        # Arguments that are not a JSON object (a model's broken call, kept as sent) go as
        # `{"_raw": text}`: the API takes only an object as a call's input.
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments_dict()} for c in message.calls]
    return blocks


def tools_param(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The `tools` parameter: each tool's name, description and JSON schema (`input_schema`)."""
    return [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools]


def claude_usage(usage: Any) -> dict[str, int]:
    """`ModelReply.usage` from a Messages API `usage` as the server sent it.

    Anthropic counts `input_tokens` apart from the prompt tokens read from its cache
    (`cache_read_input_tokens`) and written to it (`cache_creation_input_tokens`); Ratchet counts
    input tokens with the cached ones, as OpenAI does (`orchestrator.usage`). So `input_tokens` is
    the three together, `cached_tokens` the cache reads, and `cache_write_tokens` the writes (each
    costed at its own rate of `Prices`, when given). A cache count left out or null is 0; one that is
    not a whole number makes the input unknown, as a bad `input_tokens` does."""
    fresh = count(member(usage, "input_tokens"))
    read = _cache_count(member(usage, "cache_read_input_tokens"))
    written = _cache_count(member(usage, "cache_creation_input_tokens"))
    out: dict[str, int] = {}
    if fresh is not None and read is not None and written is not None:
        total = count(fresh + read + written)
        if total is not None:
            out["input_tokens"] = total
    if (output := count(member(usage, "output_tokens"))) is not None:
        out["output_tokens"] = output
    if read is not None and member(usage, "cache_read_input_tokens") is not None:
        out["cached_tokens"] = read
    if written:
        out["cache_write_tokens"] = written
    return out


def _cache_count(value: Any) -> int | None:
    return 0 if value is None else count(value)


def read_message(model: Model, raw: Any) -> ModelReply:
    """A whole reply (a `message` object as sent) as a `ModelReply`."""
    message = json_object(raw, "reply")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in json_list(message.get("content"), "content"):
        block = json_object(block, "content block")
        if block.get("type") == "text":
            texts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use":
            arguments = json.dumps(json_object(block.get("input", {}), "tool_use input"))
            call = {"id": block.get("id"), "name": block.get("name"), "arguments": arguments}
            calls.append(ToolCall.model_validate(call))
    stop = message.get("stop_reason")
    refuse_unusable(model, stop, has_text=bool(texts), has_calls=bool(calls))
    return ModelReply(
        content="".join(texts) if texts else None,
        tool_calls=calls,
        usage=claude_usage(message.get("usage")),
        response_model=message.get("model"),
        response_id=message.get("id"),
        finish_reason=stop if isinstance(stop, str) else None,
    )


def refuse_unusable(model: Model, stop: Any, *, has_text: bool, has_calls: bool) -> None:
    """Raise the final error of a reply that cannot be an answer, as Gemini's adapter does: a
    refusal (`stop_reason` refusal), a reply cut short mid tool call, or one cut short before any
    text or call. Asking again the same way gets the same reply, so none is retried."""
    if stop == "refusal":
        raise ModelCallError(
            f"{model.describe()}: the reply was withheld (stop_reason refusal: the model declined to answer); "
            "change the input or the instructions and continue the run",
            retryable=False,
            kind="ReplyBlocked",
        )
    if stop in CUT_SHORT and has_calls:
        raise truncated_call(model, str(stop))
    if stop in CUT_SHORT and not has_text:
        limit = getattr(model, "max_tokens", None)
        raise ModelCallError(
            f"{model.describe()}: the reply stopped on {stop} before any text or tool call "
            f"(max_tokens={limit}): give the model a larger max_tokens= (thinking counts against it) "
            "and continue the run",
            retryable=False,
            kind="TruncatedReply",
        )


def truncated_call(model: Model, stop: str) -> ModelCallError:
    """The final error of a reply cut (`stop`: max_tokens) in the middle of a tool call."""
    limit = getattr(model, "max_tokens", None)
    return ModelCallError(
        f"{model.describe()}: the reply stopped on {stop} in the middle of a tool call, its arguments cut "
        f"short (max_tokens={limit}): give the model a larger max_tokens= and continue the run",
        retryable=False,
        kind="TruncatedReply",
    )


class MessagesStreamReader(StreamReader):
    """A reply from the Messages API's stream events: `message_start` (id, model, the input's
    usage), each content block opened by `content_block_start` and filled by its deltas (text, or
    a tool call's arguments in `input_json_delta` fragments), `message_delta` (the stop reason and
    the output's usage), `message_stop`. Events it does not use (`ping`, thinking) are skipped."""

    def __init__(self, model: Model) -> None:
        self._model = model
        self._text: list[str] | None = None
        self._calls: dict[int, PartialCall] = {}
        self._usage: dict[str, Any] = {}
        self._stop: str | None = None
        self._ended = False
        self._id: str | None = None
        self._response_model: str | None = None

    def feed(self, event: Any) -> str | None:
        """Take one event; its text delta, if it has one."""
        event = json_object(event, "event")
        kind = event.get("type")
        if kind == "message_start":
            message = json_object(event.get("message"), "message")
            self._id, self._response_model = message.get("id"), message.get("model")
            self._usage.update(json_object(message.get("usage") or {}, "usage"))
        elif kind == "content_block_start":
            block = json_object(event.get("content_block"), "content block")
            if block.get("type") == "tool_use":
                self._calls[_index(event)] = PartialCall(id=block.get("id"), name=block.get("name"))
            elif block.get("type") == "text" and block.get("text"):
                return self._add(str(block["text"]))
        elif kind == "content_block_delta":
            delta = json_object(event.get("delta"), "delta")
            if delta.get("type") == "text_delta":
                return self._add(str(delta.get("text") or ""))
            if delta.get("type") == "input_json_delta":
                self._calls[_index(event)].arguments.append(str(delta.get("partial_json") or ""))
        elif kind == "message_delta":
            self._stop = json_object(event.get("delta") or {}, "delta").get("stop_reason") or self._stop
            # Its usage counts are cumulative: the last one of each stands.
            usage = json_object(event.get("usage") or {}, "usage")
            self._usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self._ended = True
        return None

    def _add(self, text: str) -> str:
        if self._text is None:
            self._text = []
        self._text.append(text)
        return text

    def reply(self) -> ModelReply:
        """The reply, as `read_message` reads the same answer whole."""
        if not self._ended or self._stop is None:
            raise ValueError("the stream ended before the reply's message_stop")
        refuse_unusable(self._model, self._stop, has_text=self._text is not None, has_calls=bool(self._calls))
        return ModelReply(
            content=None if self._text is None else "".join(self._text),
            # A call streamed with no input fragment has the empty object as its input.
            tool_calls=[self._calls[i].done() for i in sorted(self._calls)],
            usage=claude_usage(self._usage),
            response_model=self._response_model,
            response_id=self._id,
            finish_reason=self._stop,
        )


def _index(event: dict[str, Any]) -> int:
    index = event.get("index")
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"a content block event whose index is not a number: {index!r}")
    return index
