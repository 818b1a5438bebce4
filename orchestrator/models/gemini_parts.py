"""Ratchet's transcript as Gemini's Contents and Parts, and Gemini's replies read back as a `ModelReply`.

The transcript stays provider-neutral (Agno's `Message` fields, the OpenAI Chat shape of
`tool_calls`), so a run begun on another provider continues on Gemini and back. On the way out, as
the Gemini API's JSON (`Gemini.request` says why not the SDK's types): system messages become the
`systemInstruction`; user text a "user" Content; an assistant message
a "model" Content with its text and one `functionCall` Part per call; the tool results after it
one "user" Content of `functionResponse` Parts, put back in the order of the calls they answer
(tools commit as they finish, in any order) and named by the call they answer. Gemini gives its
calls no id (or one of its own, kept), and is sent none: it matches results by name and order.

On the way in: a reply's text (thought summaries left out), its `function_call` Parts as tool calls
of one batch, each with an id made from the step and its place in the reply (stable across a
retry of the step; the engine makes ids unique in the run), and its usage with Gemini's own counts:
`thoughts_token_count` as reasoning tokens (counted in the output, as OpenAI counts them),
`cached_content_token_count` as cached tokens (counted in the input).

A reply that cannot become an answer is a final `ModelCallError` saying why and what to change:
blocked (the prompt, or the reply for safety and the like), cut by `max_output_tokens` mid function
call or before any text, or a function call Gemini itself calls malformed. One that ended before its
finish reason (a stream cut short) is malformed and retryable, as the OpenAI adapters' are.

`google.genai` is imported only when a call is made (`orchestrator.models.gemini`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message, ToolCall, decoded_arguments
from orchestrator.models.base import ModelReply
from orchestrator.usage import count, reported_usage

if TYPE_CHECKING:
    from google.genai import types

#: The thought signature the function calls sent back carry (base64, as the JSON carries bytes).
#: Gemini 3 models refuse a turn's function calls without the signature they were issued with, and a
#: provider-neutral transcript keeps none (a call may also have come from another provider); this is
#: the value Gemini takes for a call it did not sign. Only the first call of a turn carries one, as
#: Gemini sends them.
UNSIGNED = base64.b64encode(b"skip_thought_signature_validator").decode()
#: Finish reasons of a reply withheld for what it says (or would have said).
BLOCKED = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
        "MODEL_ARMOR",
        "LANGUAGE",
    }
)
#: Finish reasons of a function call Gemini could not make.
BAD_CALLS = frozenset({"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "TOO_MANY_TOOL_CALLS", "MALFORMED_RESPONSE"})


def gemini_contents(messages: Sequence[Message]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The `systemInstruction` (None without one) and the `contents` of a transcript, as the Gemini
    API's JSON carries them (`orchestrator.models.gemini` says why not as the SDK's types)."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    # The last assistant turn's calls: id -> (its place in the turn, its name).
    calls: dict[str, tuple[int, str]] = {}
    results: list[tuple[int, int, dict[str, Any]]] = []

    def add(role: str, parts: list[dict[str, Any]]) -> None:
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        elif parts:
            contents.append({"role": role, "parts": parts})

    def flush() -> None:
        add("user", [part for *_, part in sorted(results, key=lambda r: (r[0], r[1]))])
        results.clear()

    for message in messages:
        if message.role == "tool":
            place, name = calls.get(message.tool_call_id or "", (len(calls), message.tool_name or ""))
            results.append((place, len(results), _function_response(message, message.tool_name or name)))
            continue
        flush()
        if message.role == "system":
            if message.content:
                system.append(message.content)
        elif message.role == "user":
            add("user", [{"text": message.content or ""}])
        else:
            # The OpenAI-shaped dicts as stored, read without building a `ToolCall` for each.
            turn = [(str(c.get("id")), (c.get("function") or {})) for c in message.tool_calls or ()]
            calls = {cid: (i, str(fn.get("name", ""))) for i, (cid, fn) in enumerate(turn)}
            add("model", _model_parts(message.content, [fn for _, fn in turn]))
    flush()
    return ({"parts": [{"text": "\n\n".join(system)}]} if system else None), contents


def _model_parts(content: str | None, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"text": content}] if content else []
    for i, fn in enumerate(calls):
        args = decoded_arguments(str(fn.get("arguments") or "{}"))
        part: dict[str, Any] = {"functionCall": {"name": str(fn.get("name", "")), "args": args}}
        if i == 0:
            part["thoughtSignature"] = UNSIGNED
        parts.append(part)
    return parts


def _function_response(message: Message, name: str) -> dict[str, Any]:
    key = "error" if message.tool_call_error else "result"
    return {"functionResponse": {"name": name, "response": {key: message.content or ""}}}


def gemini_usage(usage: Any) -> dict[str, int]:
    """`ModelReply.usage` from a reply's `usageMetadata` (the API's JSON): the prompt (and the prompt
    of Gemini's own tools) as input, the candidates and the thoughts as output. Gemini's JSON leaves
    out a count that is 0 (proto3), so in a `usageMetadata` that has any count, one left out is 0;
    none: unknown. A count that is not one (nothing validated this JSON) makes its sum unknown."""
    if not isinstance(usage, Mapping):
        return {}
    sent = [usage.get(name) for name in _USAGE_COUNTS]
    if all(c is None for c in sent):
        return {}
    prompt, tools, candidates, thoughts, cached = (0 if c is None else count(c) for c in sent)
    return reported_usage(_sum(prompt, tools), _sum(candidates, thoughts), cached, thoughts)


def _sum(*counts: int | None) -> int | None:
    return None if None in counts else sum(c for c in counts if c is not None)


_USAGE_COUNTS = (
    "promptTokenCount",
    "toolUsePromptTokenCount",
    "candidatesTokenCount",
    "thoughtsTokenCount",
    "cachedContentTokenCount",
)


def wire_reply(response: types.GenerateContentResponse) -> dict[str, Any]:
    """A reply (or stream chunk) of the SDK's types as the API's JSON, which `GeminiReader` reads."""
    return response.model_dump(mode="json", by_alias=True, exclude_none=True)


class GeminiReader:
    """Builds one `ModelReply` from a reply's `GenerateContentResponse`s as the API's JSON: the one of
    a whole reply, or each chunk of a stream in order (each with the next text and calls; the usage
    of the last)."""

    def __init__(self, where: str, seq: int) -> None:
        self._where = where
        self._seq = seq
        self._text: list[str] | None = None
        self._calls: list[ToolCall] = []
        self._finish: str | None = None
        self._finish_message: str | None = None
        self._blocked: str | None = None
        self._usage: dict[str, int] = {}
        #: The usage of the requests before a continuation, summed (None: there was none).
        self._spent: dict[str, int] | None = None
        self._token: str | None = None
        self._model: str | None = None
        self._id: str | None = None

    def feed(self, response: Mapping[str, Any]) -> str | None:
        """Take one response (or chunk), the API's JSON; the text it adds, if any."""
        if not isinstance(response, Mapping):
            raise ValueError(f"a reply that is not a JSON object: {type(response).__name__}")
        self._model = response.get("modelVersion") or self._model
        self._id = response.get("responseId") or self._id
        if (usage := response.get("usageMetadata")) is not None:
            self._usage = gemini_usage(usage)
        feedback = response.get("promptFeedback") or {}
        if (reason := feedback.get("blockReason")) is not None:
            said = feedback.get("blockReasonMessage")
            self._blocked = f"{reason}: {said}" if said else str(reason)
        candidates = response.get("candidates")
        if not candidates:
            return None
        candidate = candidates[0]
        self._token = candidate.get("continuationToken") or self._token
        if (finish := candidate.get("finishReason")) is not None:
            self._finish = str(finish)
            self._finish_message = candidate.get("finishMessage")
        text = []
        for part in (candidate.get("content") or {}).get("parts") or ():
            if (call := part.get("functionCall")) is not None:
                if not call.get("name"):
                    raise ValueError("a function call without a name")
                cid = call.get("id") or f"gemini_{self._seq}_{len(self._calls)}"
                self._calls.append(ToolCall(id=cid, name=call["name"], arguments=json.dumps(call.get("args") or {})))
            elif (piece := part.get("text")) is not None and not part.get("thought"):
                text.append(piece)
        if not text:
            return None
        self._text = [*(self._text or []), *text]
        return "".join(text)

    def continuation(self) -> str | None:
        """The token that resumes a whole reply stopped at the per-request token limit (finish
        reason CONTINUATION, or none, with a `continuationToken`); None when it ended. Taking it
        begins the next request's part of the reply, whose usage is added to this one's."""
        token, self._token = self._token, None
        if token is None or self._finish not in (None, "CONTINUATION") or self._blocked is not None:
            return None
        before = self._spent
        self._spent = self._usage if before is None else _added(before, self._usage)
        self._usage, self._finish, self._finish_message = {}, None, None
        return str(token)

    def reply(self) -> ModelReply:
        """The reply; a final `ModelCallError` when it cannot be an answer, `ValueError` (malformed)
        when it ended before its finish reason."""
        if self._blocked is not None:
            raise self._final(
                f"the prompt was blocked ({self._blocked}); change the input or the model's safety_settings",
                "PromptBlocked",
            )
        finish = self._finish
        if finish is None:
            raise ValueError("the reply ended before its finish reason")
        said = f" ({self._finish_message})" if self._finish_message else ""
        if finish in BLOCKED:
            raise self._final(
                f"the reply was withheld (finish reason {finish}){said}; change the input or the model's "
                "safety_settings",
                "ReplyBlocked",
            )
        if finish in BAD_CALLS:
            raise self._final(
                f"the model could not make its function call (finish reason {finish}){said}; check the tools' "
                "schemas and instructions",
                "MalformedFunctionCall",
            )
        if finish == "MAX_TOKENS" and (self._calls or self._text is None):
            what = "mid function call" if self._calls else "before any text"
            raise self._final(
                f"the reply was cut at max_output_tokens {what} (finish reason MAX_TOKENS); raise the model's "
                "max_output_tokens (thinking counts against it) or lower thinking_budget",
                "TruncatedReply",
            )
        if finish not in ("STOP", "MAX_TOKENS") and self._text is None and not self._calls:
            raise self._final(f"the reply ended with finish reason {finish} and nothing in it{said}", "EmptyReply")
        return ModelReply(
            content=None if self._text is None else "".join(self._text),
            tool_calls=self._calls,
            usage=self._usage if self._spent is None else _added(self._spent, self._usage),
            response_model=self._model,
            response_id=self._id,
            finish_reason=finish.lower(),
        )

    def _final(self, what: str, kind: str) -> ModelCallError:
        return ModelCallError(f"{self._where}: {what}", retryable=False, kind=kind)


def _added(one: dict[str, int], other: dict[str, int]) -> dict[str, int]:
    """Two requests' usage summed; a count either left unknown is unknown."""
    return {name: one[name] + other[name] for name in one.keys() & other.keys()}
