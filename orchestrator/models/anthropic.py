"""`Claude`: Anthropic's models through the official `anthropic` SDK and its Messages API.

    Claude(id="claude-sonnet-4-5")               # key from ANTHROPIC_API_KEY at each call
    Claude(id="claude-haiku-4-5", max_tokens=1024, prices=Prices(input=1, output=5))

Agno's name and constructor. The SDK is the `ratchet-agents[anthropic]` extra; it is imported
when a call is made, so importing Ratchet or an agent's module never loads it. The key is read
at each call (the argument, else ANTHROPIC_API_KEY or the file ANTHROPIC_API_KEY_FILE names) and
never kept; the base URL is the argument, else ANTHROPIC_BASE_URL, else Anthropic's. The
transcript stays Agno's fields, converted to and from the API's blocks at each call
(`orchestrator.models._claude_blocks`); failures are sorted as OpenAI's are
(`orchestrator.models._claude_client`).

Structured output (an agent's `output_schema`) asks the Messages API for it natively:
`output_config.format`, a JSON schema (the schema passed through the SDK's `transform_schema`,
which fits it to what the API takes). The reply's text is then that JSON.

As the OpenAI adapters do, the call goes through the client's `post` with the body as plain JSON
and the reply read as the JSON sent (`cast_to=object`), not `messages.create` and its typed
`Message`: the same HTTP call, errors, retries and timeouts, without validating the request and
building the reply's models on the worker's thread.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConfigurationError, ModelCallError
from orchestrator.messages import Message
from orchestrator.models._claude_blocks import (
    MessagesStreamReader,
    messages_param,
    read_message,
    system_param,
    tools_param,
)
from orchestrator.models._claude_client import API_KEY_VAR, claude_client, claude_failure
from orchestrator.models._keys import call_key
from orchestrator.models._spans import request_attributes
from orchestrator.models._streaming import stream_reply
from orchestrator.models.base import CallContext, Model, ModelReply, OutputFormat, RateLimit, ToolSpec
from orchestrator.models.failures import guarded_call, read_guarded
from orchestrator.settings import DEFAULT_MODEL_TIMEOUT, env_value
from orchestrator.usage import Prices

if TYPE_CHECKING:
    import anthropic
    from anthropic import RequestOptions

BASE_URL_VAR = "ANTHROPIC_BASE_URL"
DEFAULT_BASE_URL = "https://api.anthropic.com"
EXTRA = "ratchet-agents[anthropic]"
_MESSAGES = "/v1/messages"
#: `request_params` keys that are the client's request options rather than body parameters.
_SDK_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})


def sdk_missing() -> bool:
    """Whether the `anthropic` package cannot be imported here (looked up, not imported)."""
    if "anthropic" in sys.modules:
        return sys.modules["anthropic"] is None
    return importlib.util.find_spec("anthropic") is None


class Claude(Model):
    """A Claude model behind the Messages API. Sampling arguments left at None are not sent;
    `max_tokens` is sent always (the API requires it; Agno's default, 8192); `cache_system_prompt`
    marks the system prompt for Anthropic's prompt cache. `prices` (per million tokens) give each
    call's cost, cache reads and writes counted as input tokens (`orchestrator.usage`);
    `rate_limit`, the provider's limits on this model id, which every worker keeps together."""

    provider = "anthropic"

    def __init__(
        self,
        id: str = "claude-sonnet-4-5-20250929",
        *,
        max_tokens: int = 8192,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        stop_sequences: list[str] | None = None,
        cache_system_prompt: bool = False,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        max_retries: int = 0,
        default_headers: Mapping[str, str] | None = None,
        request_params: Mapping[str, Any] | None = None,
        prices: Prices | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        if sdk_missing():
            raise ConfigurationError(f"Claude needs the anthropic package: pip install '{EXTRA}'")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigurationError(f"Claude(max_tokens=...) must be a whole number, 1 or more; got {max_tokens!r}")
        self.id = id
        self.max_tokens = max_tokens
        self.cache_system_prompt = cache_system_prompt
        self.prices = prices
        self.rate_limit = rate_limit
        # Only an explicitly passed key is ever held, private and out of describe().
        self._api_key = api_key
        self.base_url = base_url
        self._timeout = timeout
        # 0 by default: Ratchet's retry policy retries (and records each attempt); the SDK must not.
        self.max_retries = max_retries
        self.default_headers = dict(default_headers or {})
        self.request_params = dict(request_params or {})
        given = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "stop_sequences": stop_sequences}
        #: The sampling arguments that were set.
        self.sampling: dict[str, Any] = {k: v for k, v in given.items() if v is not None}

    @property
    def timeout(self) -> float:
        """The HTTP timeout of one call when the caller gives none (see `OpenAIModel.timeout`)."""
        return self._timeout if self._timeout is not None else DEFAULT_MODEL_TIMEOUT

    def resolved_base_url(self) -> str:
        """The base URL calls go to: the argument, else ANTHROPIC_BASE_URL, else Anthropic's."""
        return self.base_url or env_value(BASE_URL_VAR) or DEFAULT_BASE_URL

    def span_attributes(self) -> dict[str, Any]:
        """The server, the API and the sampling settings, as OpenAI's adapters say them."""
        sampling = {**self.sampling, "max_tokens": self.max_tokens}
        attributes = request_attributes(self.resolved_base_url(), "messages", sampling)
        attributes.pop("openai.api.type", None)
        if "stop_sequences" in sampling:
            attributes["gen_ai.request.stop_sequences"] = list(sampling["stop_sequences"])
        if "top_k" in sampling:
            attributes["gen_ai.request.top_k"] = sampling["top_k"]
        return attributes

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        """Make one call through the official client; failures raise a classified `ModelCallError`.
        With `context.on_delta` the reply is streamed, read from the stream's events."""
        api_key = call_key(self, self._api_key, (API_KEY_VAR,))
        timeout = self._timeout or context.timeout or self.timeout  # the model's own, the worker's, the default
        if sdk_missing():
            raise ModelCallError(f"{self.describe()}: the anthropic package is not installed: pip install '{EXTRA}'")
        client = claude_client(self.resolved_base_url(), api_key, timeout, self.max_retries)
        body, options = self.request(messages, tools, context)
        limit = options.get("timeout", timeout)
        call_timeout = limit if isinstance(limit, int | float) else None
        if context.on_delta is not None:
            return stream_reply(
                self,
                lambda: self._open_stream(client, body, options),
                MessagesStreamReader(self),
                context.on_delta,
                api_key=api_key,
                timeout=call_timeout,
                classify=claude_failure,
            )
        raw = guarded_call(
            lambda: self._send(client, body, options),
            model=self,
            api_key=api_key,
            timeout=call_timeout,
            classify=claude_failure,
        )
        return read_guarded(self, api_key, read_message, self, raw)

    def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], context: CallContext
    ) -> tuple[dict[str, Any], RequestOptions]:
        """The request body and the client's request options; `request_params` as `OpenAIChat`'s
        (`extra_headers`, `extra_query`, `extra_body` and `timeout` are options, any other key a
        body parameter)."""
        extras = {k: v for k, v in self.request_params.items() if k in _SDK_OPTIONS}
        body: dict[str, Any] = {k: v for k, v in self.request_params.items() if k not in _SDK_OPTIONS}
        body.update(model=self.id, max_tokens=self.max_tokens, messages=messages_param(messages), **self.sampling)
        system = system_param(messages, cache=self.cache_system_prompt)
        if system is not None:
            body["system"] = system
        if tools:
            body["tools"] = tools_param(tools)
        if context.output is not None:
            body["output_config"] = {**(body.get("output_config") or {}), "format": output_format(context.output)}
        options: RequestOptions = {
            "headers": {**(extras.get("extra_headers") or {}), **self.default_headers, **context.headers()}
        }
        if extras.get("extra_body"):
            options["extra_json"] = extras["extra_body"]
        if extras.get("extra_query"):
            options["params"] = extras["extra_query"]
        if extras.get("timeout") is not None:
            options["timeout"] = extras["timeout"]
        return body, options

    def _send(self, client: anthropic.Anthropic, body: dict[str, Any], options: RequestOptions) -> object:
        raw = client.post(_MESSAGES, content=_encoded(body, options), cast_to=object, options=_json_options(options))
        # A body whose content type does not say JSON comes back as its text (as `post_json` reads it).
        return json.loads(raw) if isinstance(raw, str) else raw

    def _open_stream(
        self, client: anthropic.Anthropic, body: dict[str, Any], options: RequestOptions
    ) -> anthropic.Stream[object]:
        import anthropic

        return client.post(
            _MESSAGES,
            content=_encoded({**body, "stream": True}, options),
            cast_to=object,
            options=_json_options(options),
            stream=True,
            stream_cls=anthropic.Stream[object],
        )


def _encoded(body: dict[str, Any], options: RequestOptions) -> bytes:
    """The body as the JSON bytes sent, `extra_body` merged in. Encoded here rather than handed to
    the SDK as `body=`, which walks and copies the whole transcript first to make it re-sendable
    (files, iterators, pydantic models), a third of the SDK's CPU on a call 20 messages long; a
    body of plain JSON needs none of it."""
    extra = options.get("extra_json")
    return json.dumps({**body, **extra} if extra else body).encode()


def _json_options(options: RequestOptions) -> RequestOptions:
    headers = {"Content-Type": "application/json", **(options.get("headers") or {})}
    return {**{k: v for k, v in options.items() if k != "extra_json"}, "headers": headers}  # type: ignore[typeddict-item]


def output_format(output: OutputFormat) -> dict[str, Any]:
    """`output_config.format` for an output schema: a JSON schema fitted by the SDK's `transform_schema`."""
    from anthropic import transform_schema

    return {"type": "json_schema", "schema": transform_schema(output.schema)}
