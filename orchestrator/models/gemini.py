"""`Gemini`: Google's Gemini models through the official `google-genai` SDK (the Gemini API).

    Gemini(id="gemini-2.5-flash")            # key from GOOGLE_API_KEY (or GEMINI_API_KEY) at each call
    Gemini(id="gemini-2.5-pro", thinking_budget=1024, prices=Prices(input=1.25, output=10))

Agno's name and constructor (`id`, the sampling and thinking arguments, `api_key`, `timeout`,
`request_params`). Install it with `pip install 'ratchet-agents[gemini]'`; without the SDK, building
a `Gemini` is a `ConfigurationError` that says so, and importing Ratchet never imports the SDK.

Each call goes through `client.models.generate_content` (`generate_content_stream` when the run
streams), a whole reply read as the JSON the API sent (`Gemini._reply` says why). The key is read
when a call is made, never at construction and never stored: the argument, else GOOGLE_API_KEY,
else GEMINI_API_KEY (GOOGLE_API_KEY wins when both are set, as in the SDK; each may be given as a
file, `..._FILE`). Clients are cached per process and per (base URL, API version, key, timeout),
keyed by a hash of the key, and each bounds a whole call, not each read: its httpx2 client carries
the deadline hooks of `orchestrator.models._deadline`. The SDK never retries (Ratchet's retry
policy does, and records each attempt). The transcript is converted to Gemini's Contents and back
in `orchestrator.models.gemini_parts`; failures are classified in
`orchestrator.models.gemini_failures`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ConfigurationError, ModelCallError
from orchestrator.messages import Message
from orchestrator.models._clients import ClientCache
from orchestrator.models._keys import call_key
from orchestrator.models._spans import request_attributes
from orchestrator.models.base import CallContext, Model, ModelReply, RateLimit, ToolSpec
from orchestrator.models.failures import read_guarded
from orchestrator.models.gemini_failures import KEY_VARS, guarded
from orchestrator.models.gemini_parts import GeminiReader, gemini_contents, wire_reply
from orchestrator.settings import DEFAULT_MODEL_TIMEOUT, env_value
from orchestrator.usage import Prices

if TYPE_CHECKING:
    from google import genai
    from google.genai import types

    from orchestrator.models.gemini_config import LeanConfig

#: The SDK's own variable for the Gemini API's base URL, read when no `base_url` is given.
BASE_URL_VAR = "GOOGLE_GEMINI_BASE_URL"
DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/"
EXTRA = "ratchet-agents[gemini]"

#: How many times one reply stopped at the per-request token limit is resumed (the SDK sets none).
MAX_CONTINUATIONS = 32
_clients: ClientCache[genai.Client] = ClientCache()


class Gemini(Model):
    """A Gemini model. Sampling and thinking arguments left at None are not sent; `prices` (per
    million tokens) give each call's cost; `rate_limit`, the provider's limits on this model id;
    `request_params`, more fields of the SDK's `GenerateContentConfig` (`safety_settings`, ...)."""

    provider = "gcp.gemini"

    def __init__(
        self,
        id: str = "gemini-2.0-flash-001",
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        api_version: str | None = None,
        timeout: float | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        max_output_tokens: int | None = None,
        stop_sequences: list[str] | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        seed: int | None = None,
        thinking_budget: int | None = None,
        include_thoughts: bool | None = None,
        thinking_level: str | None = None,
        safety_settings: list[Any] | None = None,
        default_headers: Mapping[str, str] | None = None,
        request_params: Mapping[str, Any] | None = None,
        prices: Prices | None = None,
        rate_limit: RateLimit | None = None,
    ) -> None:
        if not _sdk_installed():
            raise ConfigurationError(
                f"Gemini(id={id!r}) needs Google's google-genai SDK: install it with pip install '{EXTRA}'"
            )
        self.id = id
        self.prices = prices
        self.rate_limit = rate_limit
        # Kept private and out of describe(); only an explicitly passed key is ever held here.
        self._api_key = api_key
        self.base_url = base_url
        #: The API version in the URL (None: the SDK's own, "v1" unless GOOGLE_GENAI_API_VERSION says).
        self.api_version = api_version
        self._timeout = timeout
        self.default_headers = dict(default_headers or {})
        self.request_params = dict(request_params or {})
        self.safety_settings = safety_settings
        values = dict(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            max_output_tokens=max_output_tokens,
            stop_sequences=stop_sequences,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            seed=seed,
        )
        #: The sampling arguments that were set.
        self.sampling: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
        thinking = dict(
            thinking_budget=thinking_budget, include_thoughts=include_thoughts, thinking_level=thinking_level
        )
        #: The thinking arguments that were set (the SDK's `ThinkingConfig`).
        self.thinking: dict[str, Any] = {k: v for k, v in thinking.items() if v is not None}
        #: The settings the kept static config was built from (a copy), and that config.
        self._static: tuple[tuple[Any, ...], LeanConfig] | None = None

    @property
    def timeout(self) -> float:
        """The HTTP timeout of one call when the caller gives none: the argument, else
        RATCHET_MODEL_TIMEOUT's default (a worker gives its own in `CallContext.timeout`)."""
        return self._timeout if self._timeout is not None else DEFAULT_MODEL_TIMEOUT

    def resolved_base_url(self) -> str:
        """The base URL calls go to: the argument, else GOOGLE_GEMINI_BASE_URL, else Google's."""
        return self.base_url or env_value(BASE_URL_VAR) or DEFAULT_BASE_URL

    def span_attributes(self) -> dict[str, Any]:
        """The server and the sampling settings, as the OpenAI adapters' spans say them."""
        attributes = request_attributes(self.resolved_base_url(), "generate_content", self.sampling)
        attributes.pop("openai.api.type", None)
        return attributes

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        """Make one call through the SDK; failures raise a classified `ModelCallError`. With
        `context.on_delta` the reply is streamed, each piece of its text handed over as it arrives."""
        api_key = call_key(self, self._api_key, KEY_VARS)
        timeout = self._timeout or context.timeout or self.timeout  # the model's own, the worker's, the default
        client = self._client(api_key, timeout)
        streamed = context.on_delta is not None
        contents, config = self.request(messages, tools, context, raw=not streamed)
        reader = GeminiReader(self.describe(), context.seq)
        if context.on_delta is None:
            return self._reply(client, contents, config, reader, api_key=api_key, timeout=timeout)
        on_delta = context.on_delta
        chunks = guarded(
            lambda: iter(client.models.generate_content_stream(model=self.id, contents=contents, config=config)),
            model=self,
            api_key=api_key,
            timeout=timeout,
        )
        try:
            while (
                chunk := guarded(lambda: next(chunks, None), model=self, api_key=api_key, timeout=timeout)
            ) is not None:
                text = read_guarded(self, api_key, lambda: reader.feed(wire_reply(chunk)))
                if text:
                    on_delta(text)  # what it raises is the caller's, and propagates as it is
        finally:
            # A stream left mid-way (a failure, or `on_delta` raising) ends the SDK's generator now.
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return read_guarded(self, api_key, reader.reply)

    def _reply(
        self,
        client: genai.Client,
        contents: types.Content,
        config: types.GenerateContentConfig,
        reader: GeminiReader,
        *,
        api_key: str,
        timeout: float,
    ) -> ModelReply:
        """A whole reply, read as the JSON the API sent: the config asks the SDK for its HTTP response
        (`should_return_http_response`), so the SDK builds none of its reply types (a
        `GenerateContentResponse` of pydantic models, walked from the JSON field by field). The SDK
        then skips its automatic continuation too, so a reply stopped at the per-request token limit
        (finish reason CONTINUATION) is resumed here the same way: the same request with its token."""
        for _ in range(MAX_CONTINUATIONS + 1):
            send = partial(client.models.generate_content, model=self.id, contents=contents, config=config)
            response = guarded(send, model=self, api_key=api_key, timeout=timeout)
            read_guarded(self, api_key, lambda sent: reader.feed(_body(sent)), response)
            if (token := reader.continuation()) is None:
                return read_guarded(self, api_key, reader.reply)
            options = config.http_options
            assert options is not None and options.extra_body is not None  # `request` sets both
            body = {**options.extra_body, "continuationToken": token}
            config = config.model_copy(update={"http_options": options.model_copy(update={"extra_body": body})})
        raise ModelCallError(
            f"{self.describe()}: the reply did not finish in {MAX_CONTINUATIONS} continuations (finish reason "
            "CONTINUATION); raise the model's max_output_tokens or ask for a shorter answer",
            retryable=False,
            kind="TruncatedReply",
        )

    def request(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec], context: CallContext, *, raw: bool = False
    ) -> tuple[types.Content, types.GenerateContentConfig]:
        """The Contents and the `GenerateContentConfig` of one call (`raw`: the SDK returns the HTTP
        response, a whole reply's JSON, instead of its reply types).

        The transcript and the tools go in the body as the Gemini API's JSON (`gemini_parts`), through
        the config's `http_options.extra_body`, which the SDK documents for fields in the API's own
        shape and merges into the body it built, over its `contents` (one empty Content here). As the
        SDK's types, the SDK walks every Part field by field to build that same JSON: 80 ms of the
        worker's CPU per call, GIL held, for a transcript of 32 messages. The config's own fields
        (sampling, thinking, the output schema) stay the SDK's types, validated once for the model's
        settings (`orchestrator.models.gemini_config`, which says what the SDK's walk of them costs);
        its client, errors, timeouts and streaming are the same either way.

        The `contents` the SDK is given is one Content, no Part (the SDK walks each), and not in a
        list: the SDK validates a list of Contents against each type its union of contents takes,
        which costs as much of the caller's CPU as the rest of the request."""
        from orchestrator.models.gemini_config import EMPTY_CONTENT, call_config

        system, wire = gemini_contents(messages)
        body: dict[str, Any] = {"contents": wire}
        if system is not None:
            body["systemInstruction"] = system
        if tools:
            declarations = [
                {"name": t.name, "description": t.description, "parametersJsonSchema": t.parameters} for t in tools
            ]
            body["tools"] = [{"functionDeclarations": declarations}]
        config = call_config(
            self._static_config(), headers=context.headers(), body=body, output=context.output, raw=raw
        )
        return EMPTY_CONTENT, config

    def _static_config(self) -> LeanConfig:
        """The config's fields this model's settings give, built once and kept while the settings
        stay equal to a copy taken when it was built (a setting changed, even inside a value,
        builds it again; settings that cannot be copied build it at every call)."""
        from orchestrator.models.gemini_config import static_config

        settings = (self.request_params, self.sampling, self.safety_settings, self.thinking, self.default_headers)
        kept = self._static
        if kept is not None and kept[0] == settings:
            return kept[1]
        config = static_config(*settings)
        try:
            snapshot = copy.deepcopy(settings)
        except Exception:  # an object in request_params that cannot be copied: nothing is kept
            self._static = None
        else:
            # One tuple, swapped whole: a thread that reads it sees either the old pair or the new.
            self._static = (snapshot, config)
        return config

    def _client(self, api_key: str, timeout: float) -> genai.Client:
        return client_for(self.resolved_base_url(), self.api_version, api_key, timeout)


def _body(response: types.GenerateContentResponse) -> Any:
    """The JSON of a reply the SDK returned as its HTTP response (`should_return_http_response`)."""
    http = response.sdk_http_response
    if http is None or not http.body:
        raise ValueError("a reply without a body")
    return json.loads(http.body)


def _sdk_installed() -> bool:
    try:
        return importlib.util.find_spec("google.genai") is not None
    except (ImportError, ValueError):  # `google` is not a package here, or the module was blocked
        return False


def client_for(base_url: str, api_version: str | None, api_key: str, timeout: float) -> genai.Client:
    """A cached `genai.Client` for these settings in this process; `timeout` bounds a whole call."""

    def build() -> genai.Client:
        import httpx2
        from google import genai
        from google.genai import types

        from orchestrator.models._deadline import deadline_hooks

        options = types.HttpOptions(
            base_url=base_url,
            api_version=api_version,
            timeout=max(1, round(timeout * 1000)),  # milliseconds
            httpx_client=httpx2.Client(timeout=timeout, event_hooks=deadline_hooks()),
        )
        return genai.Client(api_key=api_key, vertexai=False, http_options=options)

    return _clients.get(api_key, (base_url, api_version, timeout), build)
