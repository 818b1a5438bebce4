"""The pure logic of a scripted OpenAI-compatible model: given a request, decide the answer.

Everything here is a function of the request, so an HTTP server (`orchestrator.testing.server`)
and an in-process model (`orchestrator.testing.scripted_model`) answer the same way. The turn of a
request is 1 + the number of assistant turns already in its conversation, which makes the
script stateless across retries and processes; only fault budgets (`Fault.times`) need
memory, and that lives in a `ScriptState` the caller owns.

A conversation is a list of chat-style dicts (`orchestrator.testing.conversation` builds it
from request bodies and describes it). Tools are `{"name", "description", "parameters"}`.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.testing.arguments import arguments_from_schema

NO_TOOLS_TEXT = "no tools were called"

# Error `type`/`code` per status, as OpenAI sends them, so clients classify our faults like real ones.
_ERROR_SHAPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "model_not_found"),
    408: ("timeout", None),
    409: ("conflict", None),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
    529: ("server_error", "overloaded"),  # Anthropic's overloaded, as an OpenAI-shaped body
}


class Fault(BaseModel):
    """An error the script returns instead of answering.

    `times` is per conversation (None = every time); `turn` None matches every turn. With `body`
    the response carries that text as is instead of OpenAI's error shape: a proxy's HTML page, or
    a 200 whose body is not JSON (a status below 400 needs a body). With `break_stream_after` a
    streamed answer starts as usual but is cut after that many events: with status 200 its
    connection closes with no end, as when a provider or a proxy drops it mid-reply;
    with a 4xx or 5xx an error event of that status's shape ends it, as a provider failing
    mid-reply sends. A request that does not stream is not matched by such a fault.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    turn: int | None = None
    status: int
    times: int | None = 1
    retry_after: float | None = None
    message: str = "scripted failure"
    body: str | None = None
    content_type: str = "application/json"
    break_stream_after: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _a_success_needs_a_body(self) -> Self:
        if self.break_stream_after is not None:
            if (self.status != 200 and self.status < 400) or self.body is not None:
                raise ValueError(
                    "a fault that cuts a stream takes status 200 (a dropped connection) or a 4xx/5xx, no body"
                )
        elif self.status < 400 and self.body is None:
            raise ValueError(f"a fault with status {self.status} needs a body (the error shape is for 4xx and 5xx)")
        return self


class ScriptConfig(BaseModel):
    """What the scripted model does; see the field comments. Build it in tests or send it as JSON."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: If set, only these API keys are accepted; any other gets 401.
    accept_keys: list[str] | None = None
    #: These API keys get 401 (checked before `accept_keys`).
    reject_keys: list[str] = Field(default_factory=list)
    #: When tools are offered, the first `tool_batches` turns answer with tool calls.
    tool_batches: int = 1
    #: Tool calls in each batch.
    calls_per_batch: int = 1
    #: The tool to call (default: the first offered).
    tool: str | None = None
    #: The arguments to send (default: built from the tool's JSON schema).
    arguments: dict[str, Any] | None = None
    #: An explicit script that overrides the four fields above: batch k answers turn k+1 with
    #: calls `{"tool": name, "arguments": {...}}`; after the last batch comes the final text.
    batches: list[list[dict[str, Any]]] | None = None
    #: Template of the final answer; placeholders {user} (the last user text), {users} (every user
    #: text of the conversation, session history included, joined by " | "), {tool_results} and {turn}.
    final_text: str = "Summary: {tool_results}"
    #: A chat: turns count from the last user message, so each new user message (a session's
    #: next run, whose history holds earlier answers) gets the whole script again.
    chat: bool = False
    #: Final answers sent as they are instead of `final_text` (JSON, valid or not, for an `output_schema`): the
    #: one at index (user messages - 1), the last repeating: the correction after an invalid reply gets the next.
    final_replies: list[str] | None = None
    #: Seconds to wait before answering, applied by whoever serves the decision.
    delay_s: float = 0.0
    #: Seconds between the bytes of each answer's body, which the HTTP server then sends one byte
    #: at a time (a reply that trickles in); the in-process ScriptedModel has no wire and ignores it,
    #: and a streamed answer is paced by `chunk_delay_s` instead.
    trickle_s: float = 0.0
    #: Seconds between the events of a streamed answer (a reply the model writes as it goes).
    chunk_delay_s: float = 0.0
    #: Errors to return instead of answering; the first matching fault with budget left fires.
    faults: list[Fault] = Field(default_factory=list)
    #: On this turn the tool calls' arguments are not valid JSON.
    malformed_arguments_on_turn: int | None = None
    #: Fields of each reply's `usage` object sent as given over the counts the script makes, in
    #: the API's own names (`prompt_tokens`, ... for Chat Completions; `input_tokens`, ... for
    #: Responses): a provider whose usage is not what its API says. The HTTP server's replies: one
    #: not streamed, a streamed chat's usage chunk, a streamed response's `response.completed`.
    usage_fields: dict[str, Any] = Field(default_factory=dict)
    #: The Gemini API's whole (not streamed) final answers are sent in this many more requests
    #: parts: each before the last stops at finish reason CONTINUATION with the token that asks for
    #: the next (a reply past the per-request token limit).
    gemini_continuations: int = 0
    #: Per model id, a whole config used instead of this one (a team leader and its members).
    by_model: dict[str, ScriptConfig] = Field(default_factory=dict)

    def for_model(self, model: str) -> ScriptConfig:
        """The config that answers requests for `model`."""
        return self.by_model.get(model, self)


class ScriptState:
    """How many times each fault has fired, per conversation. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fired: dict[tuple[str, str, int], int] = {}

    def try_fire(self, conversation_key: str, scope: str, index: int, times: int | None) -> bool:
        """Spend one firing of fault `index` if it has budget left; True when it fires."""
        key = (conversation_key, scope, index)
        # Check and increment under one lock: concurrent retries must not both see budget left.
        with self._lock:
            fired = self._fired.get(key, 0)
            if times is not None and fired >= times:
                return False
            self._fired[key] = fired + 1
            return True

    def reset(self) -> None:
        """Forget every firing."""
        with self._lock:
            self._fired.clear()


@dataclass(frozen=True, kw_only=True)
class ScriptedError:
    """Answer with an HTTP error: `body` is OpenAI's error shape, `retry_after` the Retry-After seconds.

    `raw`, when set, is sent as the body instead (with `content_type`): a body that is not the
    error shape, or a 200 that is not a reply."""

    status: int
    body: dict[str, Any]
    retry_after: float | None = None
    turn: int = 0
    delay_s: float = 0.0
    raw: str | None = None
    content_type: str = "application/json"

    @property
    def message(self) -> str:
        """The error's message text."""
        return str(self.body.get("error", {}).get("message", ""))


@dataclass(frozen=True, kw_only=True)
class ScriptedReply:
    """Answer with text or tool calls `(id, name, arguments_json_text)`; `usage` holds estimated tokens."""

    content: str | None = None
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    usage: dict[str, int] = field(default_factory=dict)
    turn: int = 0
    delay_s: float = 0.0
    #: A streamed answer is cut after this many events (a `Fault`'s `break_stream_after`): by
    #: this error (OpenAI's error body) if set, else by closing the connection.
    break_after: int | None = None
    break_error: dict[str, Any] | None = None

    @property
    def finish_reason(self) -> Literal["tool_calls", "stop"]:
        """Chat Completions' finish_reason for this reply."""
        return "tool_calls" if self.tool_calls else "stop"


Decision = ScriptedError | ScriptedReply


def error_body(status: int, message: str) -> dict[str, Any]:
    """OpenAI's error body for a status."""
    kind, code = _ERROR_SHAPES.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def conversation_key(run_id: str | None, conversation: Sequence[Mapping[str, Any]]) -> str:
    """The key fault budgets are counted under: the run id, else a hash of the first user message."""
    if run_id:
        return run_id
    first_user = next((m.get("content") or "" for m in conversation if m.get("role") == "user"), "")
    return "user:" + _digest(str(first_user))


def turn_of(conversation: Sequence[Mapping[str, Any]], *, since_user: bool = False) -> int:
    """1 + the number of assistant turns already in the conversation (`since_user`: since its
    last user message)."""
    turns = 0
    for m in conversation:
        if m.get("role") == "assistant":
            turns += 1
        elif since_user and m.get("role") == "user":
            turns = 0
    return 1 + turns


def _usage(prompt_tokens: int, out: int) -> dict[str, int]:
    """As if half the prompt were a cached prefix and half the output reasoning: each count distinct."""
    return dict(
        input_tokens=prompt_tokens, output_tokens=out, cached_tokens=prompt_tokens // 2, reasoning_tokens=out // 2
    )


def estimate_tokens(text: str) -> int:
    """A rough token count (4 characters a token) so usage numbers move with the conversation."""
    return max(1, len(text) // 4) if text else 0


def decide(
    config: ScriptConfig,
    state: ScriptState,
    *,
    model: str,
    api_key: str | None,
    conversation: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    conversation_key: str,
    stream: bool = False,
) -> Decision:
    """Decide how the scripted model answers one request (`stream`: whether it asked for a
    stream). No I/O; `delay_s` is for the caller."""
    scope = model if model in config.by_model else ""
    cfg = config.for_model(model)
    turn = turn_of(conversation, since_user=cfg.chat)
    denied = _check_key(cfg, api_key)
    if denied is not None:
        return ScriptedError(status=401, body=error_body(401, denied), turn=turn, delay_s=cfg.delay_s)
    fault = _firing_fault(cfg, state, turn=turn, conversation_key=conversation_key, scope=scope, stream=stream)
    if fault is not None and fault.break_stream_after is None:
        return ScriptedError(
            status=fault.status,
            body=error_body(fault.status, fault.message),
            retry_after=fault.retry_after,
            turn=turn,
            delay_s=cfg.delay_s,
            raw=fault.body,
            content_type=fault.content_type,
        )
    reply = _reply(cfg, turn=turn, tools=tools, conversation=conversation, conversation_key=conversation_key)
    if fault is None:
        return reply
    error = error_body(fault.status, fault.message) if fault.status >= 400 else None
    return replace(reply, break_after=fault.break_stream_after, break_error=error)


def _firing_fault(
    cfg: ScriptConfig, state: ScriptState, *, turn: int, conversation_key: str, scope: str, stream: bool
) -> Fault | None:
    # A fault that cuts streams neither matches nor spends its budget on a request that does not stream.
    for index, fault in enumerate(cfg.faults):
        if (fault.turn is not None and fault.turn != turn) or (fault.break_stream_after is not None and not stream):
            continue
        if state.try_fire(conversation_key, scope, index, fault.times):
            return fault
    return None


def _reply(
    cfg: ScriptConfig,
    *,
    turn: int,
    tools: Sequence[Mapping[str, Any]],
    conversation: Sequence[Mapping[str, Any]],
    conversation_key: str,
) -> ScriptedReply:
    calls = _planned_calls(cfg, turn, tools, conversation)
    prompt_tokens = sum(estimate_tokens(_text_of(m)) for m in conversation)
    if calls:
        # Deterministic per conversation and turn, at a cost that does not grow with the
        # conversation (hashing all of it made every call cost more as the run grew).
        first_user = next((str(m.get("content") or "") for m in conversation if m.get("role") == "user"), "")
        ids_seed = _digest(json.dumps([conversation_key, turn, first_user]))
        tool_calls = [
            (
                f"call_{turn}_{i}_{ids_seed}",
                name,
                _arguments_text(args, malformed=cfg.malformed_arguments_on_turn == turn),
            )
            for i, (name, args) in enumerate(calls)
        ]
        return ScriptedReply(
            tool_calls=tool_calls,
            usage=_usage(prompt_tokens, sum(estimate_tokens(name + args) for _, name, args in tool_calls)),
            turn=turn,
            delay_s=cfg.delay_s,
        )
    content = _final_text(cfg.final_text, conversation, turn)
    if cfg.final_replies:
        users = sum(1 for m in conversation if m.get("role") == "user")
        content = cfg.final_replies[min(max(users - 1, 0), len(cfg.final_replies) - 1)]
    return ScriptedReply(
        content=content,
        usage=_usage(prompt_tokens, estimate_tokens(content)),
        turn=turn,
        delay_s=cfg.delay_s,
    )


def _check_key(cfg: ScriptConfig, api_key: str | None) -> str | None:
    # The messages never contain the key: a test double must not teach clients to leak it.
    if not api_key:
        return "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'."
    if api_key in cfg.reject_keys or (cfg.accept_keys is not None and api_key not in cfg.accept_keys):
        return "Incorrect API key provided"
    return None


def _planned_calls(
    cfg: ScriptConfig, turn: int, tools: Sequence[Mapping[str, Any]], conversation: Sequence[Mapping[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    if not tools:
        return []
    user_text = _last_user_text(conversation)
    if cfg.batches is not None:
        if turn > len(cfg.batches):
            return []
        return [
            (str(c["tool"]), _arguments_for(str(c["tool"]), c.get("arguments"), tools, user_text))
            for c in cfg.batches[turn - 1]
        ]
    if turn > cfg.tool_batches:
        return []
    name = cfg.tool or str(tools[0]["name"])
    return [(name, _arguments_for(name, cfg.arguments, tools, user_text)) for _ in range(cfg.calls_per_batch)]


def _arguments_for(
    name: str, explicit: Mapping[str, Any] | None, tools: Sequence[Mapping[str, Any]], user_text: str
) -> dict[str, Any]:
    if explicit is not None:
        return dict(explicit)
    # A tool that is not offered still gets called (to test unknown-tool handling), with no arguments.
    offered = next((t for t in tools if t.get("name") == name), None)
    return arguments_from_schema((offered or {}).get("parameters"), user_text)


def _arguments_text(args: dict[str, Any], *, malformed: bool) -> str:
    if not malformed:
        return json.dumps(args)
    # A cut-off object, as a model that ran out of tokens mid-call would send.
    first = next(iter(args), "query")
    return "{" + json.dumps(first) + ": "


def _final_text(template: str, conversation: Sequence[Mapping[str, Any]], turn: int) -> str:
    results = [str(m.get("content") or "") for m in conversation if m.get("role") == "tool"]
    # Plain replacement, not str.format: templates may hold JSON braces.
    return (
        template.replace(
            "{users}", " | ".join(str(m.get("content") or "") for m in conversation if m.get("role") == "user")
        )
        .replace("{user}", _last_user_text(conversation))
        .replace("{tool_results}", "; ".join(results) if results else NO_TOOLS_TEXT)
        .replace("{turn}", str(turn))
    )


def _last_user_text(conversation: Sequence[Mapping[str, Any]]) -> str:
    return next((str(m.get("content") or "") for m in reversed(conversation) if m.get("role") == "user"), "")


def _text_of(message: Mapping[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    return str(message.get("content") or "") + "".join(str(c.get("arguments", "")) for c in calls)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]
