"""`OpenAIChat`: a model behind the Chat Completions API (OpenAI or any compatible server).

    OpenAIChat(id="gpt-4o")                      # key from OPENAI_API_KEY at each call
    OpenAIChat(id="llama3", base_url="http://localhost:11434/v1")

The constructor mirrors Agno's. See `orchestrator.models._openai` for how the key, the base URL
and errors are handled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.messages import Message, ToolCall
from orchestrator.models._json import json_list, json_object, member, post_json
from orchestrator.models._openai import OpenAIModel, sampling
from orchestrator.models._streaming import PartialCall, StreamReader
from orchestrator.models.base import ModelReply, OutputFormat, RateLimit, ToolSpec
from orchestrator.models.failures import malformed
from orchestrator.usage import Prices, reported_usage

if TYPE_CHECKING:
    import openai
    from openai import RequestOptions


class OpenAIChat(OpenAIModel):
    """A Chat Completions model. Sampling arguments left at None are not sent; `prices` (per million
    tokens) give each call's cost (`orchestrator.usage`); `rate_limit`, the provider's limits on
    this model id, which every worker keeps together (`orchestrator.limits`)."""

    def __init__(
        self,
        id: str = "gpt-4o",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        max_retries: int = 0,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        user: str | None = None,
        parallel_tool_calls: bool | None = None,
        organization: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        request_params: Mapping[str, Any] | None = None,
        prices: Prices | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        super().__init__(
            id,
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            organization=organization,
            default_headers=default_headers,
            request_params=request_params,
            prices=prices,
            rate_limit=rate_limit,
        )
        self.sampling = sampling(
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_tokens,
            max_completion_tokens=max_completion_tokens,
            seed=seed,
            stop=stop,
            user=user,
        )
        self.parallel_tool_calls = parallel_tool_calls

    def build_request(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """`model`, `messages`, `tools` and the sampling arguments of one Chat Completions call."""
        params: dict[str, Any] = {"model": self.id, "messages": [chat_message(m) for m in messages], **self.sampling}
        if tools:
            params["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
            if self.parallel_tool_calls is not None:
                params["parallel_tool_calls"] = self.parallel_tool_calls
        return params

    def output_params(self, output: OutputFormat) -> dict[str, Any]:
        """`response_format` with a strict JSON schema."""
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": output.name, "schema": output.schema, "strict": True},
            }
        }

    def send(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> Any:
        """POST /chat/completions (see `OpenAIModel.send` for why not `chat.completions.create`)."""
        return post_json(client, "/chat/completions", params, options)

    def open_stream(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> openai.Stream[Any]:
        """POST /chat/completions with `stream: true`, the usage asked for in the last chunk.

        Each chunk comes out as the JSON object the server sent (`Stream[object]`), not a
        `ChatCompletionChunk` (`orchestrator.models._json`): building that model cost the worker
        about as much as the rest of a delta's way to its readers (a 32-chunk reply from the
        scripted server read in 17.4 ms typed and 8.9 ms as JSON, bench/FINDINGS.md), and
        `ChatStreamReader` reads a handful of its fields."""
        import openai

        stream_options = {**(params.get("stream_options") or {}), "include_usage": True}
        body = {**params, "stream": True, "stream_options": stream_options}
        return client.post(
            "/chat/completions",
            body=body,
            cast_to=object,
            options=options,
            stream=True,
            stream_cls=openai.Stream[object],
        )

    def stream_reader(self) -> StreamReader:
        """Reads `chat.completion.chunk`s (see `ChatStreamReader`)."""
        return ChatStreamReader()

    def read_reply(self, raw: Any) -> ModelReply:
        """The first choice's text and function calls, read from the reply's JSON; arguments are
        passed through unparsed."""
        reply = json_object(raw, "reply")
        choices = reply.get("choices")
        choice: Any = choices[0] if isinstance(choices, list) and choices else None
        if member(choice, "message") is None:
            raise malformed(self, "the reply has no choices")
        message = json_object(choice["message"], "message")
        calls = []
        for call in json_list(message.get("tool_calls") or [], "tool_calls"):
            call = json_object(call, "tool call")
            if call.get("function") is None:
                # A custom (non-function) tool call: Ratchet only offers function tools.
                continue
            function = json_object(call["function"], "function")
            # Invalid JSON is not an error here: the engine reports it to the model as a tool error.
            arguments = function.get("arguments") or "{}"
            calls.append(
                ToolCall.model_validate({"id": call.get("id"), "name": function.get("name"), "arguments": arguments})
            )
        return ModelReply(
            content=message.get("content"),
            tool_calls=calls,
            usage=chat_usage(reply.get("usage")),
            response_model=reply.get("model"),
            response_id=reply.get("id"),
            finish_reason=choice.get("finish_reason"),
        )


class ChatStreamReader(StreamReader):
    """The first choice's text deltas, its tool calls' fragments keyed by their `index`, and the
    usage of the last chunk (which has no choices), read from each chunk's JSON object (a part
    that is not the object it should be is a malformed reply: `read_guarded`)."""

    def __init__(self) -> None:
        self._text: list[str] | None = None
        self._calls: dict[int, PartialCall] = {}
        self._finished: str | None = None
        self._usage: dict[str, int] = {}
        self._model: str | None = None
        self._id: str | None = None

    def feed(self, event: Any) -> str | None:
        """Take one chunk; its text delta, if it has one."""
        chunk = json_object(event, "chunk")
        usage = chunk.get("usage")
        if usage is not None:
            self._usage = chat_usage(usage)
        self._model = chunk.get("model") or self._model
        self._id = chunk.get("id") or self._id
        choice = next((c for c in map(_choice, chunk.get("choices") or []) if c.get("index") == 0), None)
        if choice is None:
            return None
        if choice.get("finish_reason") is not None:
            self._finished = str(choice["finish_reason"])
        delta = json_object(choice.get("delta") or {}, "delta")
        for fragment in delta.get("tool_calls") or []:
            fragment = json_object(fragment, "tool call fragment")
            call = self._calls.setdefault(_index(fragment.get("index")), PartialCall())
            # Some servers repeat the id and the name in every fragment: the last one stands.
            call.id = fragment.get("id") or call.id
            function = fragment.get("function")
            if function is not None:
                function = json_object(function, "function")
                call.name = function.get("name") or call.name
                if function.get("arguments"):
                    call.arguments.append(function["arguments"])
        text = delta.get("content")
        if text is None:
            return None
        if self._text is None:
            self._text = []
        self._text.append(text)
        return str(text)

    def reply(self) -> ModelReply:
        """The reply, as `OpenAIChat.read_reply` reads the same answer whole."""
        if not self._finished:
            raise ValueError("the stream ended before the reply's finish_reason")
        return ModelReply(
            content=None if self._text is None else "".join(self._text),
            tool_calls=[self._calls[i].done() for i in sorted(self._calls)],
            usage=self._usage,
            response_model=self._model,
            response_id=self._id,
            finish_reason=self._finished,
        )


def _choice(value: Any) -> dict[str, Any]:
    return json_object(value, "choice")


def _index(value: Any) -> int:
    """A tool call fragment's `index` (a server that sends one call may leave it out: 0)."""
    if value is None:
        return 0
    if not isinstance(value, int):
        raise TypeError(f"a tool call fragment whose index is not a number: {value!r}")
    return value


def chat_usage(usage: Any) -> dict[str, int]:
    """`ModelReply.usage` from a Chat Completions `usage` as the server sent it, in a whole reply
    or the last chunk of a stream: a count that is no whole number, or a `usage` that is no
    object (None: the provider reported none), is unknown."""
    return reported_usage(
        member(usage, "prompt_tokens"),
        member(usage, "completion_tokens"),
        member(member(usage, "prompt_tokens_details"), "cached_tokens"),
        member(member(usage, "completion_tokens_details"), "reasoning_tokens"),
    )


def chat_message(message: Message) -> dict[str, Any]:
    """One transcript message in the Chat Completions shape."""
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in message.calls]
        return out
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content or ""}
    return {"role": message.role, "content": message.content or ""}
