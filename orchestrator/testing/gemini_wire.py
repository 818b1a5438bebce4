"""The scripted server's Gemini API: `POST /v1beta/models/{model}:generateContent` and
`:streamGenerateContent?alt=sse` (under `/v1/` too, the SDK's default version), answered as
`orchestrator.testing.script.decide` says.

A request's Contents become the script's neutral conversation (`gemini_conversation`): the
`systemInstruction` a system message, a "model" Content an assistant turn with its function calls
(given ids of their place, as Gemini sends none), `functionResponse` Parts tool messages answering
the last turn's calls by name and order. The SDK sends a declaration's `parameters_json_schema` by
its proto name, which Google's JSON parsing takes as well as the camelCase one. The key is the
`x-goog-api-key` header (or the `key` query parameter), checked as the bearer key is.

Replies are built as the SDK's own types (`GenerateContentResponse`, `Candidate`, `Part`, ...) and
dumped by their aliases, camelCase, which is what the SDK's client parses. A stream sends one per
SSE `data:` event: the text a word a chunk, the function calls whole in one chunk, the finish
reason and the usage in the last. Errors have Google's body, `{"error": {"code", "message",
"status"}}`, a 429's `RetryInfo` detail carrying its wait.

`server.py` routes these paths here (`GeminiExchange(handler, route).serve()`); the request log
entries are as the OpenAI APIs', with `api` "gemini".
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from orchestrator.testing.script import ScriptedError, ScriptedReply, conversation_key, decide
from orchestrator.testing.streams import words

if TYPE_CHECKING:
    from google.genai import types

RUN_ID_HEADER = "X-Ratchet-Run-Id"
STEP_HEADER = "X-Ratchet-Step"
_ROUTE = re.compile(r"^/(?:v1|v1beta|v1alpha)/models/([^/:?]+):(generateContent|streamGenerateContent)$")
#: The status of a stream's error event, from the type of the script's (OpenAI-shaped) error body.
_BREAK_STATUS = {"requests": 429, "invalid_request_error": 400, "server_error": 500}
#: Google's status names for the HTTP statuses the script sends.
STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


@dataclass(frozen=True)
class GeminiRoute:
    """A Gemini API path: the model it names and whether it streams."""

    model: str
    stream: bool


def gemini_route(path: str) -> GeminiRoute | None:
    """The Gemini API call `path` (with its query) asks for; None if it is not one."""
    match = _ROUTE.match(path.split("?", 1)[0])
    if match is None:
        return None
    return GeminiRoute(model=match[1], stream=match[2] == "streamGenerateContent")


def gemini_conversation(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The script's conversation and tools of a `generateContent` request body."""
    conversation: list[dict[str, Any]] = []
    system = body.get("systemInstruction")
    if system:
        conversation.append(_entry("system", _texts(system.get("parts") if isinstance(system, dict) else None)))
    calls: list[dict[str, Any]] = []
    for content in body.get("contents") or []:
        parts = content.get("parts") or []
        if content.get("role") == "model":
            calls = _model_calls(parts)
            conversation.append({**_entry("assistant", _texts(parts)), "tool_calls": calls or None})
            continue
        answered = 0
        for part in parts:
            if "functionResponse" in part:
                response = part["functionResponse"]
                call = _answered(calls, response, answered)
                answered += 1
                entry = _entry("tool", _result_text(response.get("response")))
                conversation.append({**entry, "tool_call_id": call.get("id") if call else response.get("id")})
        text = _texts([p for p in parts if "text" in p])
        if text is not None or not answered:
            conversation.append(_entry("user", text or ""))
    tools = [
        {
            "name": d.get("name"),
            "description": d.get("description"),
            "parameters": d.get("parametersJsonSchema") or d.get("parameters_json_schema") or d.get("parameters"),
        }
        for tool in body.get("tools") or []
        for d in tool.get("functionDeclarations") or []
    ]
    return conversation, tools


def _model_calls(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A "model" Content's function calls as the script's tool calls, each given the id of its
    place when Gemini gave it none."""
    calls = [part["functionCall"] for part in parts if "functionCall" in part]
    return [
        {"id": call.get("id") or f"fc_{i}", "name": call.get("name"), "arguments": json.dumps(call.get("args") or {})}
        for i, call in enumerate(calls)
    ]


def _answered(calls: list[dict[str, Any]], response: Mapping[str, Any], place: int) -> dict[str, Any] | None:
    # By id when Gemini gave one, else the call of that name at that place, else the first of that name.
    by_id = next((c for c in calls if response.get("id") and c["id"] == response.get("id")), None)
    if by_id is not None:
        return by_id
    if place < len(calls) and calls[place]["name"] == response.get("name"):
        return calls[place]
    return next((c for c in calls if c["name"] == response.get("name")), None)


def _result_text(response: Any) -> str:
    if isinstance(response, dict) and len(response) == 1:
        (value,) = response.values()
        if isinstance(value, str):
            return value
    return json.dumps(response)


def _texts(parts: Any) -> str | None:
    texts = [
        str(p.get("text") or "") for p in parts or [] if isinstance(p, dict) and "text" in p and not p.get("thought")
    ]
    return "".join(texts) if texts else None


def _entry(role: str, content: str | None) -> dict[str, Any]:
    return {"role": role, "content": content, "tool_calls": None, "tool_call_id": None}


def error_payload(status: int, message: str, retry_after: float | None = None) -> dict[str, Any]:
    """Google's error body for a status (a 429's wait as its `RetryInfo` detail)."""
    error: dict[str, Any] = {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}
    if retry_after is not None:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_after:g}s"}]
    return {"error": error}


def usage_metadata(usage: Mapping[str, int]) -> types.GenerateContentResponseUsageMetadata:
    """The script's usage as Gemini counts it: the candidates without the thoughts."""
    from google.genai import types

    tokens_in, tokens_out = usage["input_tokens"], usage["output_tokens"]
    thoughts = usage.get("reasoning_tokens", 0)
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=tokens_in,
        candidates_token_count=tokens_out - thoughts,
        thoughts_token_count=thoughts,
        cached_content_token_count=usage.get("cached_tokens", 0),
        total_token_count=tokens_in + tokens_out,
    )


def response_body(model: str, reply: ScriptedReply, usage_fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A whole `GenerateContentResponse` for a reply, as the wire carries it."""
    from google.genai import types

    parts = [types.Part(text=reply.content)] if reply.content is not None else []
    parts += [
        types.Part(function_call=types.FunctionCall(name=name, args=json.loads(args) if _is_object(args) else {}))
        for _, name, args in reply.tool_calls
    ]
    return _chunk(model, parts, finish=True, usage=reply.usage, usage_fields=usage_fields, ident=_ident())


def stream_bodies(model: str, reply: ScriptedReply, usage_fields: Mapping[str, Any] | None = None) -> list[bytes]:
    """A reply as `streamGenerateContent?alt=sse` sends it: SSE events, each a `GenerateContentResponse`."""
    from google.genai import types

    ident = _ident()
    whole = response_body(model, reply, usage_fields)
    if reply.tool_calls:
        return [_event(whole)]
    pieces = words(reply.content or "") or [""]
    events = [_event(_chunk(model, [types.Part(text=w)], finish=False, usage=None, ident=ident)) for w in pieces[:-1]]
    last = _chunk(
        model, [types.Part(text=pieces[-1])], finish=True, usage=reply.usage, usage_fields=usage_fields, ident=ident
    )
    return [*events, _event(last)]


def continued(body: dict[str, Any], text: str, part: int, parts_after: int) -> dict[str, Any]:
    """`body` as part `part` of a reply sent in `parts_after` + 1 requests: its share of `text`, and
    before the last, finish reason CONTINUATION with the token of the next part."""
    from google.genai import types

    bounds = [len(text) * i // (parts_after + 1) for i in range(parts_after + 2)]
    last = part >= parts_after
    candidate = types.Candidate(
        content=types.Content(role="model", parts=[types.Part(text=text[bounds[part] : bounds[part + 1]])]),
        index=0,
        finish_reason=types.FinishReason.STOP if last else types.FinishReason.CONTINUATION,
        continuation_token=None if last else str(part + 1).encode(),
    )
    return {**body, "candidates": [candidate.model_dump(mode="json", by_alias=True, exclude_none=True)]}


def error_event(status: int, message: str) -> bytes:
    """A provider failing mid-stream: an SSE event whose data is Google's error body."""
    return _event(error_payload(status, message))


def _chunk(
    model: str,
    parts: list[types.Part],
    *,
    finish: bool,
    usage: Mapping[str, int] | None,
    ident: str,
    usage_fields: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    from google.genai import types

    candidate = types.Candidate(
        content=types.Content(role="model", parts=parts),
        index=0,
        finish_reason=types.FinishReason.STOP if finish else None,
    )
    response = types.GenerateContentResponse(
        candidates=[candidate],
        model_version=model,
        response_id=ident,
        usage_metadata=usage_metadata(usage) if usage else None,
    )
    body = response.model_dump(mode="json", by_alias=True, exclude_none=True)
    if usage and usage_fields:
        body["usageMetadata"] = {**body["usageMetadata"], **usage_fields}
    return body


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _ident() -> str:
    return uuid.uuid4().hex[:22]


def _event(body: Mapping[str, Any]) -> bytes:
    return f"data: {json.dumps(body)}\r\n\r\n".encode()


class GeminiExchange:
    """One Gemini API request on the scripted server's handler: read, decided, logged, answered."""

    def __init__(self, handler: Any, route: GeminiRoute) -> None:
        self.handler = handler
        self.route = route
        #: Which part of a continued reply the request asks for (its `continuationToken`; 0: the first).
        self.continuation = 0

    def serve(self) -> None:
        """Answer the request as the script decides (the handler's own send methods write it)."""
        handler, owner = self.handler, self.handler.server.owner
        body = handler.read_json()
        if body is None:
            return
        try:
            conversation, tools = gemini_conversation(body)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            handler.send_json(400, error_payload(400, f"malformed generateContent request: {exc}"))
            return
        token = body.get("continuationToken")
        self.continuation = int(base64.b64decode(token)) if isinstance(token, str) else 0
        model, stream = self.route.model, self.route.stream
        run_id = handler.headers.get(RUN_ID_HEADER)
        key = conversation_key(run_id, conversation)
        api_key = handler.headers.get("x-goog-api-key") or _query_key(handler.path)
        decision = decide(
            owner.config,
            owner.state,
            model=model,
            api_key=api_key,
            conversation=conversation,
            tools=tools,
            conversation_key=key,
            stream=stream,
        )
        owner.record(self._entry(body, decision, conversation, run_id, key, api_key))
        owner.holding.wait(model)
        if decision.delay_s > 0:
            time.sleep(decision.delay_s)
        self._reply(decision)

    def _entry(
        self,
        body: Mapping[str, Any],
        decision: ScriptedReply | ScriptedError,
        conversation: list[dict[str, Any]],
        run_id: str | None,
        key: str,
        api_key: str | None,
    ) -> dict[str, Any]:
        config = body.get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        return {
            "api": "gemini",
            "model": self.route.model,
            "turn": decision.turn,
            "conversation_key": key,
            "run_id": run_id,
            "step": self.handler.headers.get(STEP_HEADER),
            "status": decision.status if isinstance(decision, ScriptedError) else 200,
            "tool_calls": 0 if isinstance(decision, ScriptedError) else len(decision.tool_calls),
            "usage": None if isinstance(decision, ScriptedError) else dict(decision.usage),
            "stream": self.route.stream,
            "params": sorted(k for k in body if k != "contents") + sorted(f"generationConfig.{k}" for k in config),
            "query": sorted(k for k in _query(self.handler.path) if k != "key"),
            "output_format": (str(schema.get("title") or "json") if isinstance(schema, dict) else None),
            "last_user": next((str(m["content"] or "") for m in reversed(conversation) if m["role"] == "user"), ""),
            "users": [str(m["content"] or "") for m in conversation if m["role"] == "user"],
            "key_last4": api_key[-4:] if api_key and len(api_key) >= 12 else None,
            "at": time.time(),
        }

    def _reply(self, decision: ScriptedReply | ScriptedError) -> None:
        handler, owner = self.handler, self.handler.server.owner
        cfg = owner.config.for_model(self.route.model)
        if isinstance(decision, ScriptedError):
            if decision.raw is not None:
                handler.send(decision.status, decision.raw.encode(), decision.content_type, trickle_s=cfg.trickle_s)
            else:
                payload = error_payload(decision.status, decision.message, decision.retry_after)
                handler.send_json(decision.status, payload, trickle_s=cfg.trickle_s)
            return
        if not self.route.stream:
            body = response_body(self.route.model, decision, cfg.usage_fields)
            if cfg.gemini_continuations and decision.content and not decision.tool_calls:
                body = continued(body, decision.content, self.continuation, cfg.gemini_continuations)
            handler.send_json(200, body, trickle_s=cfg.trickle_s)
            return
        events = stream_bodies(self.route.model, decision, cfg.usage_fields)
        cut = decision.break_after
        if cut is not None and decision.break_error is not None:
            error = decision.break_error["error"]
            status = _BREAK_STATUS.get(str(error.get("type")), 500)
            events, cut = [*events[:cut], error_event(status, str(error.get("message")))], None
        handler.send_events(events, delay_s=cfg.chunk_delay_s, cut=cut)


def _query(path: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(path).query)


def _query_key(path: str) -> str | None:
    values = _query(path).get("key")
    return values[0] if values else None


def gemini_base_url(server: Any) -> str:
    """The base URL the Gemini SDK takes for a scripted server (its root: the SDK adds the version)."""
    return f"http://{server.host}:{server.port}/"
