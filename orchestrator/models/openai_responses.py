"""`OpenAIResponses`: a model behind OpenAI's Responses API.

    OpenAIResponses(id="gpt-4.1", reasoning_effort="low")

Each call sends the whole transcript as `input` items (no `previous_response_id`), so a step
retried on another worker makes exactly the same request. See `orchestrator.models._openai` for
how the key, the base URL and errors are handled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ModelCallError
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


class OpenAIResponses(OpenAIModel):
    """A Responses API model. Sampling arguments left at None are not sent; `prices` (per million
    tokens) give each call's cost (`orchestrator.usage`); `rate_limit`, the provider's limits on
    this model id, which every worker keeps together (`orchestrator.limits`)."""

    api_type = "responses"

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
        max_output_tokens: int | None = None,
        reasoning_effort: str | None = None,
        store: bool | None = None,
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
            max_output_tokens=max_output_tokens,
            reasoning={"effort": reasoning_effort} if reasoning_effort else None,
            store=store,
            user=user,
        )
        self.parallel_tool_calls = parallel_tool_calls

    def build_request(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """`model`, `input` items, `tools` and the sampling arguments of one Responses call."""
        params: dict[str, Any] = {"model": self.id, "input": input_items(messages), **self.sampling}
        if tools:
            # strict=False: the API defaults function tools to strict schemas, which ordinary
            # signatures (optional arguments, open objects) do not satisfy.
            params["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": False,
                }
                for t in tools
            ]
            if self.parallel_tool_calls is not None:
                params["parallel_tool_calls"] = self.parallel_tool_calls
        return params

    def output_params(self, output: OutputFormat) -> dict[str, Any]:
        """`text.format` with a strict JSON schema (kept beside any `text` options of `request_params`)."""
        text = self.request_params.get("text")
        options = dict(text) if isinstance(text, Mapping) else {}
        fmt = {"type": "json_schema", "name": output.name, "schema": output.schema, "strict": True}
        return {"text": {**options, "format": fmt}}

    def send(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> Any:
        """POST /responses (see `OpenAIModel.send` for why not `responses.create`)."""
        return post_json(client, "/responses", params, options)

    def open_stream(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> openai.Stream[Any]:
        """POST /responses with `stream: true`, each event read as the JSON object the server sent
        (`Stream[object]`, `orchestrator.models._json`), not a typed `ResponseStreamEvent`."""
        import openai

        return client.post(
            "/responses",
            body={**params, "stream": True},
            cast_to=object,
            options=options,
            stream=True,
            stream_cls=openai.Stream[object],
        )

    def stream_reader(self) -> StreamReader:
        """Reads Responses stream events (see `ResponsesStreamReader`)."""
        return ResponsesStreamReader(self)

    def failed(self, response: Any) -> ModelCallError:
        """The error for a response whose status is `failed` (retryable: the next try may be fine)."""
        detail = member(member(response, "error"), "message") or "the response failed"
        return ModelCallError(f"{self.describe()}: {detail}", retryable=True, kind="ResponseFailed")

    def read_reply(self, raw: Any) -> ModelReply:
        """The output's text and function calls, read from the response's JSON; arguments are
        passed through unparsed."""
        response = json_object(raw, "response")
        if response.get("status") == "failed":
            raise self.failed(response)
        output = response.get("output")
        if not output:
            raise malformed(self, "the response has no output")
        texts: list[str] = []
        calls: list[ToolCall] = []
        saw_message = False
        for item in map(_item, json_list(output, "output")):
            kind = item.get("type")
            if kind == "message":
                saw_message = True
                parts = [json_object(p, "content part") for p in json_list(item.get("content"), "message content")]
                texts.extend(p["text"] for p in parts if p.get("type") == "output_text" and p.get("text"))
            elif kind == "function_call":
                calls.append(_call(item).done())
        if not saw_message and not calls:
            raise malformed(self, "the output has neither a message nor a function call")
        return replied(response, "".join(texts) if saw_message else None, calls)


class ResponsesStreamReader(StreamReader):
    """The text of `response.output_text.delta`, function calls from `response.output_item.added`
    and their `response.function_call_arguments.delta` fragments, and the usage of the final
    `response.completed` (or `response.incomplete`, which a whole reply is read through too), read
    from each event's JSON object (a part that is not the object it should be is a malformed
    reply: `read_guarded`)."""

    def __init__(self, model: OpenAIResponses) -> None:
        self._model = model
        self._text: list[str] = []
        self._calls: dict[int, PartialCall] = {}
        self._saw_message = False
        self._final: Any = None

    def feed(self, event: Any) -> str | None:
        """Take one event; its text delta, if it is one."""
        event = json_object(event, "event")
        kind = event.get("type")
        if kind == "response.output_text.delta":
            self._text.append(_text(event, "delta"))
            return self._text[-1]
        if kind == "response.output_item.added":
            item = _item(event.get("item"))
            if item.get("type") == "message":
                self._saw_message = True
            elif item.get("type") == "function_call":
                self._calls[event["output_index"]] = _call(item)
        elif kind == "response.function_call_arguments.delta":
            self._calls[event["output_index"]].arguments.append(_text(event, "delta"))
        elif kind == "response.function_call_arguments.done":
            # The whole arguments: they stand whatever the fragments said.
            self._calls[event["output_index"]].arguments = [_text(event, "arguments")]
        elif kind in ("response.completed", "response.incomplete"):
            self._final = json_object(event.get("response"), "response")
        elif kind == "response.failed":
            raise self._model.failed(event.get("response"))
        return None

    def reply(self) -> ModelReply:
        """The reply, as `OpenAIResponses.read_reply` reads the same response whole."""
        if self._final is None:
            raise ValueError("the stream ended before response.completed")
        calls = [self._calls[i].done() for i in sorted(self._calls)]
        if not self._saw_message and not calls:
            raise malformed(self._model, "the output has neither a message nor a function call")
        return replied(self._final, "".join(self._text) if self._saw_message else None, calls)


def replied(response: dict[str, Any], content: str | None, calls: list[ToolCall]) -> ModelReply:
    """The reply of a response's JSON, whole or streamed. The Responses API gives no finish
    reason: an incomplete response's reason ("max_output_tokens", "content_filter") stands for
    it, else Chat Completions' words ("tool_calls", "stop"), so traces read alike for both APIs."""
    incomplete = member(response.get("incomplete_details"), "reason")
    return ModelReply(
        content=content,
        tool_calls=calls,
        usage=responses_usage(response.get("usage")),
        response_model=response.get("model"),
        response_id=response.get("id"),
        finish_reason=incomplete or ("tool_calls" if calls else "stop"),
    )


def responses_usage(usage: Any) -> dict[str, int]:
    """`ModelReply.usage` from a Responses API `usage` as the server sent it: a count that is no
    whole number, or a `usage` that is no object (None: the provider reported none), is unknown."""
    return reported_usage(
        member(usage, "input_tokens"),
        member(usage, "output_tokens"),
        member(member(usage, "input_tokens_details"), "cached_tokens"),
        member(member(usage, "output_tokens_details"), "reasoning_tokens"),
    )


def _item(value: Any) -> dict[str, Any]:
    return json_object(value, "output item")


def _call(item: dict[str, Any]) -> PartialCall:
    """A `function_call` item's call (its arguments may still come in fragments when streamed).
    Invalid JSON is not an error here: the engine reports it to the model as a tool error."""
    return PartialCall(id=item.get("call_id"), name=item.get("name"), arguments=[_text(item, "arguments", "")])


def _text(value: dict[str, Any], name: str, missing: str | None = None) -> str:
    """The text `value[name]`, `missing` if it is null or absent and that is allowed."""
    text = value.get(name)
    if text is None and missing is not None:
        return missing
    if not isinstance(text, str):
        raise TypeError(f"a {name} that is not text: {type(text).__name__}")
    return text


def input_items(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """A transcript as Responses `input` items.

    An assistant message becomes its text as a message item (if any) followed by one
    function_call item per call; a tool message becomes a function_call_output item.
    """
    items: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "assistant":
            if m.content or not m.calls:
                items.append({"role": "assistant", "content": m.content or ""})
            items.extend(
                {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments} for c in m.calls
            )
        elif m.role == "tool":
            items.append({"type": "function_call_output", "call_id": m.tool_call_id or "", "output": m.content or ""})
        else:
            items.append({"role": m.role, "content": m.content or ""})
    return items
