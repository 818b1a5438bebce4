"""Shared code of the OpenAI adapters: the base class, its client and the API key.

The API key is read when a call is made, never at construction, so a model object can be built
where no key exists (a producer) and a key fixed on the workers takes effect on the next call.
Clients are cached per process and per (base URL, key, timeout, retries)
(`orchestrator.models._clients`); each bounds a whole call, not each read
(`orchestrator.models._deadline`).

Ratchet's settings are not read here: a worker reads them once, at start, and passes the model
timeout of each call in `CallContext.timeout`.

A key that cannot go into an HTTP header is refused before any client is built, and whatever the
call raises reaches logs and the broker only as a `ModelCallError` whose text holds no key
(`orchestrator.models.failures` classifies it).

`openai` is imported lazily: importing an agent definition should not cost the SDK's import time
in processes that never call the model.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.messages import Message
from orchestrator.models._clients import client_for
from orchestrator.models._keys import API_KEY_VAR, call_key
from orchestrator.models._spans import request_attributes
from orchestrator.models._streaming import StreamReader, stream_reply
from orchestrator.models.base import CallContext, Model, ModelReply, OutputFormat, RateLimit, ToolSpec
from orchestrator.models.failures import guarded_call, read_guarded
from orchestrator.settings import DEFAULT_MODEL_TIMEOUT, env_value
from orchestrator.usage import Prices

if TYPE_CHECKING:
    import openai
    from openai import RequestOptions

#: `request_params` keys that `create()` takes as request options rather than body parameters.
_SDK_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
BASE_URL_VAR = "OPENAI_BASE_URL"
DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIModel(Model):
    """Base of the OpenAI adapters: key and base URL resolution, the client, error handling."""

    provider = "openai"
    #: The API, as a trace names it (`openai.api.type`).
    api_type = "chat_completions"

    def __init__(
        self,
        id: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float | None = None,
        max_retries: int = 0,
        organization: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        request_params: Mapping[str, Any] | None = None,
        prices: Prices | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        self.id = id
        self.prices = prices
        self.rate_limit = rate_limit
        # Kept private and out of describe(); only an explicitly passed key is ever held here.
        self._api_key = api_key
        self.base_url = base_url
        self._timeout = timeout
        # 0 by default: Ratchet's retry policy retries (and records each attempt); the SDK must not.
        self.max_retries = max_retries
        self.organization = organization
        self.default_headers = dict(default_headers or {})
        self.request_params = dict(request_params or {})
        #: The sampling arguments that were set (the adapter's own; see `sampling`).
        self.sampling: dict[str, Any] = {}

    @property
    def timeout(self) -> float:
        """The HTTP timeout of one call when the caller gives none: the argument, else
        RATCHET_MODEL_TIMEOUT's default. A worker gives its own setting in `CallContext.timeout`;
        the adapter never reads settings during a call."""
        return self._timeout if self._timeout is not None else DEFAULT_MODEL_TIMEOUT

    def resolved_base_url(self) -> str:
        """The base URL calls go to: the argument, else OPENAI_BASE_URL, else OpenAI's."""
        return self.base_url or env_value(BASE_URL_VAR) or DEFAULT_BASE_URL

    def span_attributes(self) -> dict[str, Any]:
        """The server, the API and the sampling settings (`orchestrator.models._spans`)."""
        return request_attributes(self.resolved_base_url(), self.api_type, self.sampling)

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        """Make one call through the official client; failures raise a classified `ModelCallError`.
        With `context.on_delta` the reply is streamed (`orchestrator.models._streaming`)."""
        api_key = call_key(self, self._api_key, (API_KEY_VAR,))
        timeout = self._timeout or context.timeout or self.timeout  # the model's own, the worker's, the default
        client = client_for(self.resolved_base_url(), api_key, timeout, self.max_retries, self.organization)
        params, options = self.request(messages, tools, context)
        limit = options.get("timeout", timeout)
        call_timeout = limit if isinstance(limit, int | float) else None
        if context.on_delta is not None:
            return stream_reply(
                self,
                lambda: self.open_stream(client, params, options),
                self.stream_reader(),
                context.on_delta,
                api_key=api_key,
                timeout=call_timeout,
            )
        raw = guarded_call(
            lambda: self.send(client, params, options), model=self, api_key=api_key, timeout=call_timeout
        )
        return read_guarded(self, api_key, self.read_reply, raw)

    def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], context: CallContext
    ) -> tuple[dict[str, Any], RequestOptions]:
        """The request body and the client's request options. In `request_params`, the keys the
        SDK's `create()` takes as options mean what they mean there: `extra_body` is merged into
        the body, `extra_query` goes to the query string, `extra_headers` to the headers and
        `timeout` bounds this call; every other key is a body parameter."""
        extras = {k: v for k, v in self.request_params.items() if k in _SDK_OPTIONS}
        params = {k: v for k, v in self.request_params.items() if k not in _SDK_OPTIONS}
        params.update(self.build_request(messages, tools))
        if context.output is not None:
            params.update(self.output_params(context.output))
        options: RequestOptions = {
            "headers": {**(extras.get("extra_headers") or {}), **self.default_headers, **context.headers()}
        }
        if extras.get("extra_body"):
            options["extra_json"] = extras["extra_body"]
        if extras.get("extra_query"):
            options["params"] = extras["extra_query"]
        if extras.get("timeout") is not None:
            options["timeout"] = extras["timeout"]
        return params, options

    @abstractmethod
    def build_request(self, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The API's request parameters (model, messages/input, tools, sampling)."""

    @abstractmethod
    def output_params(self, output: OutputFormat) -> dict[str, Any]:
        """The request parameters that ask for a reply following `output`'s JSON schema."""

    @abstractmethod
    def send(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> Any:
        """Make the HTTP call with the client's `post` (its documented way to send a body as is),
        not `chat.completions.create(**params)`: `create` first walks the whole request against
        its typed schema, which costs the worker 22 ms of CPU, GIL held, for a 200-message
        transcript (1 ms through `post`). The body is plain JSON built by `build_request`, which
        that walk would not change; errors, retries and timeouts are the SDK's."""

    @abstractmethod
    def read_reply(self, raw: Any) -> ModelReply:
        """Read the reply's JSON as sent (`orchestrator.models._json`) into a `ModelReply`, or raise MalformedReply."""

    @abstractmethod
    def open_stream(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> openai.Stream[Any]:
        """`send` with `stream: true`: returns once the headers are in, the events still to read."""

    @abstractmethod
    def stream_reader(self) -> StreamReader:
        """A reader that builds this API's `ModelReply` from its stream's events."""


def sampling(**values: Any) -> dict[str, Any]:
    """The sampling parameters that were set (None means: let the provider choose)."""
    return {k: v for k, v in values.items() if v is not None}
