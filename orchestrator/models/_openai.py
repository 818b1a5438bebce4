"""Shared code of the OpenAI adapters: clients, the API key, and error classification.

The API key is read when a call is made, never at construction, so a model object can be built
where no key exists (a producer) and a key fixed on the workers takes effect on the next call.
Clients are cached per process and per (base URL, key, timeout, retries): building one per call
is slow, and keying by the key means a rotated key gets a fresh client.

`openai` is imported lazily: importing an agent definition should not cost the SDK's import time
in processes that never call the model.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models.base import CallContext, Model, ModelReply, ToolSpec
from orchestrator.settings import Settings, env_secret, env_value

if TYPE_CHECKING:
    import openai
    from openai import RequestOptions

#: `request_params` keys that `create()` takes as request options rather than body parameters.
_SDK_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
API_KEY_VAR = "OPENAI_API_KEY"
BASE_URL_VAR = "OPENAI_BASE_URL"
DEFAULT_BASE_URL = "https://api.openai.com/v1"

_KIND_BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
}
# sk-, sk-proj-, and the masked forms OpenAI echoes back ("sk-abc***wxyz").
_KEY_PATTERN = re.compile(r"sk-[A-Za-z0-9_*\-]+")
_CONTEXT_LENGTH_HINTS = ("context_length_exceeded", "context length", "maximum context", "context window")

_MAX_CLIENTS = 16
_clients: dict[tuple[Any, ...], openai.OpenAI] = {}
_clients_lock = threading.Lock()


def retryable_status(status: int) -> bool:
    """Whether an HTTP status may succeed on a retry: 408, 409, 429 and 5xx do; other 4xx are final."""
    return status in (408, 409, 429) or status >= 500


def kind_for_status(status: int) -> str:
    """The openai exception class name the SDK raises for a status."""
    return _KIND_BY_STATUS.get(status, "InternalServerError" if status >= 500 else "APIStatusError")


def is_context_length_error(code: str | None, message: str) -> bool:
    """Whether a provider error says the conversation no longer fits the model (final: retrying cannot help)."""
    text = f"{code or ''} {message}".lower()
    return any(hint in text for hint in _CONTEXT_LENGTH_HINTS)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms`, or `Retry-After` as seconds or an HTTP date."""
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = _finite(lowered.get("retry-after-ms"))
    if millis is not None:
        return max(0.0, millis / 1000)
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _finite(raw)
    if seconds is not None:
        return max(0.0, seconds)
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def redact(text: str, secret: str | None = None) -> str:
    """`text` without API keys: anything like `sk-...` becomes `sk-***`, and `secret` itself `***`."""
    if secret and len(secret) >= 4:
        text = text.replace(secret, "***")
    return _KEY_PATTERN.sub("sk-***", text)


def malformed(model: Model, what: str) -> ModelCallError:
    """The error for a reply that cannot be read (retryable: the next sample may be fine)."""
    return ModelCallError(f"{model.describe()}: malformed reply: {what}", retryable=True, kind="MalformedReply")


def translate_error(exc: Exception, *, model: Model, api_key: str | None) -> ModelCallError:
    """Classify an openai exception into a `ModelCallError` whose text holds no key."""
    import openai

    kind = type(exc).__name__
    detail = redact(str(getattr(exc, "message", None) or exc), api_key)
    where = model.describe()
    if isinstance(exc, openai.APIResponseValidationError):
        return malformed(model, detail)
    if isinstance(exc, openai.APIConnectionError):
        # Includes APITimeoutError: the request may not have reached the provider, or it was slow.
        return ModelCallError(f"{where}: {kind}: {detail}", retryable=True, kind=kind)
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = retryable_status(status) and not is_context_length_error(exc.code, detail)
        hint = ""
        if status in (401, 403):
            hint = f" (check {API_KEY_VAR} in the environment of the workers)"
        return ModelCallError(
            f"{where}: {kind} (HTTP {status}){hint}: {detail}",
            retryable=retryable,
            status_code=status,
            retry_after=parse_retry_after(exc.response.headers),
            kind=kind,
        )
    return ModelCallError(f"{where}: {kind}: {detail}", retryable=False, kind=kind)


def client_for(
    base_url: str, api_key: str, timeout: float, max_retries: int, organization: str | None
) -> openai.OpenAI:
    """A cached `openai.OpenAI` for these settings in this process."""
    import openai

    # The pid keeps a forked worker from reusing its parent's connection pool; the key is hashed
    # so the cache's keys are not one more copy of it.
    digest = hashlib.sha256(api_key.encode()).hexdigest()
    key = (os.getpid(), base_url, digest, timeout, max_retries, organization)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = openai.OpenAI(
                api_key=api_key,
                base_url=base_url,
                timeout=timeout,
                max_retries=max_retries,
                organization=organization,
            )
            if len(_clients) >= _MAX_CLIENTS:
                # Drop the oldest (rotated keys, old forks); a caller still holding it keeps working.
                _clients.pop(next(iter(_clients)))
            _clients[key] = client
        return client


class OpenAIModel(Model):
    """Base of the OpenAI adapters: key and base URL resolution, the client, error handling."""

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
    ) -> None:
        self.id = id
        # Kept private and out of describe(); only an explicitly passed key is ever held here.
        self._api_key = api_key
        self.base_url = base_url
        self._timeout = timeout
        self._env_timeout: float | None = None
        # 0 by default: Ratchet's retry policy retries (and records each attempt); the SDK must not.
        self.max_retries = max_retries
        self.organization = organization
        self.default_headers = dict(default_headers or {})
        self.request_params = dict(request_params or {})

    @property
    def timeout(self) -> float:
        """The HTTP timeout of one call when the caller gives none: the argument, else
        RATCHET_MODEL_TIMEOUT (read once, kept apart from the argument: the worker's own
        `CallContext.timeout` must still win over it on later calls)."""
        if self._timeout is not None:
            return self._timeout
        if self._env_timeout is None:
            self._env_timeout = Settings.from_env().model_timeout
        return self._env_timeout

    def resolved_base_url(self) -> str:
        """The base URL calls go to: the argument, else OPENAI_BASE_URL, else OpenAI's."""
        return self.base_url or env_value(BASE_URL_VAR) or DEFAULT_BASE_URL

    def describe(self) -> str:
        """Class, model id and (if set) a credential-free base URL; never the key."""
        if not self.base_url:
            return super().describe()
        parts = urlsplit(self.base_url)
        # Userinfo and query strings are where credentials hide in URLs.
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        safe = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        return f"{type(self).__name__}(id={self.id!r}, base_url={safe!r})"

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        """Make one call through the official client; failures raise a classified `ModelCallError`."""
        import openai

        api_key = self._api_key or env_secret(API_KEY_VAR)
        if not api_key:
            raise ModelCallError(
                f"{self.describe()}: no API key: set {API_KEY_VAR} in the environment of the workers "
                "(it is read at each call, so no restart is needed)",
                retryable=False,
                kind="AuthenticationError",
            )
        timeout = self._timeout or context.timeout or self.timeout  # the model's own, the worker's, the default
        client = client_for(self.resolved_base_url(), api_key, timeout, self.max_retries, self.organization)
        params, options = self.request(messages, tools, context)
        failure: ModelCallError | None = None
        try:
            raw = self.send(client, params, options)
        except openai.OpenAIError as exc:
            failure = translate_error(exc, model=self, api_key=api_key)
        if failure is not None:
            # Raised outside the except block so the SDK's exception (whose text may hold part
            # of the key) is not chained into tracebacks and logs.
            raise failure
        try:
            return self.read_reply(raw)
        except ModelCallError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # A reply the provider sent but we cannot read (a tool call without an id or a name,
            # a missing field): the next sample may be fine, so it is retried like a 5xx.
            raise malformed(self, f"{type(exc).__name__}: {str(exc)[:300]}") from None

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
    def send(self, client: openai.OpenAI, params: dict[str, Any], options: RequestOptions) -> Any:
        """Make the HTTP call with the client's `post` (its documented way to send a body as is),
        not `chat.completions.create(**params)`: `create` first walks the whole request against
        its typed schema, which costs the worker 22 ms of CPU, GIL held, for a 200-message
        transcript (1 ms through `post`). The body is plain JSON built by `build_request`, which
        that walk would not change; errors, retries, timeouts and the reply's types are the SDK's."""

    @abstractmethod
    def read_reply(self, raw: Any) -> ModelReply:
        """Turn the API's answer into a `ModelReply`, or raise `MalformedReply`."""


def sampling(**values: Any) -> dict[str, Any]:
    """The sampling parameters that were set (None means: let the provider choose)."""
    return {k: v for k, v in values.items() if v is not None}


def _finite(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
