"""Shared code of the OpenAI adapters: clients, the API key, and error classification.

The API key is read when a call is made, never at construction, so a model object can be built
where no key exists (a producer) and a key fixed on the workers takes effect on the next call.
Clients are cached per process and per (base URL, key, timeout, retries)
(`orchestrator.models._clients`); each bounds a whole call, not each read
(`orchestrator.models._deadline`).

Ratchet's settings are not read here: a worker reads them once, at start, and passes the model
timeout of each call in `CallContext.timeout`.

A key that cannot go into an HTTP header is refused before any client is built, and whatever the
call raises reaches logs and the broker only as a `ModelCallError` whose text holds no key. An
exception the caller's runtime injects into the call (Celery's soft time limit) is not the call's
error: it propagates as it is, even from an SDK that wraps it as a connection error.

`openai` is imported lazily: importing an agent definition should not cost the SDK's import time
in processes that never call the model.
"""

from __future__ import annotations

import json
import math
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models._clients import client_for
from orchestrator.models._keys import key_problem, redact
from orchestrator.models._spans import request_attributes
from orchestrator.models.base import CallContext, Model, ModelReply, OutputFormat, RateLimit, ToolSpec
from orchestrator.settings import DEFAULT_MODEL_TIMEOUT, env_secret, env_value
from orchestrator.usage import Prices

if TYPE_CHECKING:
    import openai
    from openai import RequestOptions

    from orchestrator.models._streaming import StreamReader

#: `request_params` keys that `create()` takes as request options rather than body parameters.
_SDK_OPTIONS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
API_KEY_VAR = "OPENAI_API_KEY"
BASE_URL_VAR = "OPENAI_BASE_URL"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
_TIMEOUT_VAR = "RATCHET_MODEL_TIMEOUT"

_KIND_BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
}
# Packages whose exceptions are network failures: the cause of a real APIConnectionError.
_TRANSPORT_PACKAGES = frozenset({"httpx", "httpx2", "httpcore", "httpcore2", "h11", "h2", "anyio", "ssl", "socket"})
# What the HTTP call itself may raise besides openai's errors: Python's error categories and the
# HTTP and SDK stack's own types. Anything else (Celery's SoftTimeLimitExceeded) was injected by
# the caller's runtime and is not the call's to classify.
_CALL_ERRORS = (
    ArithmeticError, AssertionError, AttributeError, LookupError, OSError, RuntimeError, TypeError, ValueError,
)  # fmt: skip
_STACK_PACKAGES = _TRANSPORT_PACKAGES | {"openai", "pydantic", "pydantic_core", "jiter"}
_CONTEXT_LENGTH_HINTS = ("context_length_exceeded", "context length", "maximum context", "context window")

T = TypeVar("T")


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


def malformed(model: Model, what: str) -> ModelCallError:
    """The error for a reply that cannot be read (retryable: the next sample may be fine)."""
    return ModelCallError(f"{model.describe()}: malformed reply: {what}", retryable=True, kind="MalformedReply")


def injected_cause(exc: BaseException) -> BaseException | None:
    """The exception an SDK older than 3.14.1 wrapped as `APIConnectionError` although it is no
    network failure (Celery's SoftTimeLimitExceeded raised during the call), else None."""
    import openai

    cause = exc.__cause__
    if not isinstance(exc, openai.APIConnectionError) or cause is None or isinstance(cause, OSError):
        return None
    return None if _package(cause) in _TRANSPORT_PACKAGES else cause


def is_call_error(exc: BaseException) -> bool:
    """Whether the HTTP call itself raised `exc` (a bad header, a body that is not JSON, an SDK
    bug), as opposed to the caller's runtime interrupting it."""
    return isinstance(exc, _CALL_ERRORS) or _package(exc) in _STACK_PACKAGES


def translate_call_error(exc: BaseException, *, model: Model, api_key: str | None) -> ModelCallError:
    """A `ModelCallError` for a non-openai exception from the call, with no key in its text."""
    kind = type(exc).__name__
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        # A 200 whose body is not JSON: a proxy's page, a reply cut short. The next try may be fine.
        # Redacted before it is cut: a cut through the key would leave a piece redact cannot match.
        start = redact(exc.doc, api_key)[:80] if isinstance(exc, json.JSONDecodeError) else ""
        return malformed(
            model,
            f"the body is not JSON ({kind}: {exc}; it starts {_safe(start)!r})",
        )
    detail = _safe(redact(str(exc), api_key)[:300])
    return ModelCallError(
        f"{model.describe()}: the call failed before a reply could be read: {kind}: {detail} "
        "(check the model's settings: base_url, default_headers, request_params)",
        retryable=False,
        kind=kind,
    )


def translate_error(
    exc: Exception, *, model: Model, api_key: str | None, timeout: float | None = None
) -> ModelCallError:
    """Classify an openai exception into a `ModelCallError` whose text holds no key."""
    import openai

    kind = type(exc).__name__
    detail = redact(str(getattr(exc, "message", None) or exc), api_key)
    where = model.describe()
    if isinstance(exc, openai.APIResponseValidationError):
        return malformed(model, detail)
    if isinstance(exc, openai.APITimeoutError) and timeout is not None:
        limit = f"no whole reply within {timeout:g}s, the limit of one call: the model's timeout=, else {_TIMEOUT_VAR}"
        return ModelCallError(f"{where}: {kind}: {detail} ({limit})", retryable=True, kind=kind)
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


def guarded_call(call: Callable[[], T], *, model: Model, api_key: str | None, timeout: float | None) -> T:
    """`call()`, whose failure is raised as `call_failure` makes it: outside the except block, so
    the SDK's exception (whose text or arguments may hold the key, as a UnicodeEncodeError's do) is
    not chained into tracebacks and logs."""
    try:
        return call()
    except Exception as exc:
        failure = call_failure(exc, model=model, api_key=api_key, timeout=timeout)
        if failure is None:
            raise
    raise failure


def call_failure(exc: Exception, *, model: Model, api_key: str | None, timeout: float | None) -> BaseException | None:
    """What a call that raised `exc` raises instead: a classified `ModelCallError`, or the
    exception the caller's runtime injected (which an old SDK wrapped); None when `exc` is not
    the call's error and must propagate as it is."""
    import openai

    if isinstance(exc, openai.OpenAIError):
        return injected_cause(exc) or translate_error(exc, model=model, api_key=api_key, timeout=timeout)
    if not is_call_error(exc):
        return None
    return translate_call_error(exc, model=model, api_key=api_key)


def read_guarded(model: Model, api_key: str | None, read: Callable[..., T], *args: Any) -> T:
    """`read(*args)`, where a reply the provider sent but that cannot be read (a tool call without
    an id or a name, a missing field) is a malformed reply: the next sample may be fine, so it is
    retried like a 5xx."""
    try:
        return read(*args)
    except ModelCallError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise malformed(model, f"{type(exc).__name__}: {redact(str(exc), api_key)[:300]}") from None


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

    def describe(self) -> str:
        """Class, model id and (if set) a credential-free base URL; never the key."""
        if not self.base_url:
            return super().describe()
        parts = urlsplit(self.base_url)
        # Userinfo and query strings are where credentials hide in URLs.
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        safe = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        return f"{type(self).__name__}(id={self.id!r}, base_url={safe!r})"

    def span_attributes(self) -> dict[str, Any]:
        """The server, the API and the sampling settings (`orchestrator.models._spans`)."""
        return request_attributes(self.resolved_base_url(), self.api_type, self.sampling)

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        """Make one call through the official client; failures raise a classified `ModelCallError`.
        With `context.on_delta` the reply is streamed (`orchestrator.models._streaming`)."""
        api_key = self._api_key or env_secret(API_KEY_VAR)
        if not api_key:
            raise ModelCallError(
                f"{self.describe()}: no API key: set {API_KEY_VAR} in the environment of the workers "
                "(it is read at each call, so no restart is needed)",
                retryable=False,
                kind="AuthenticationError",
            )
        if (problem := key_problem(api_key)) is not None:
            raise self._bad_key(problem)
        timeout = self._timeout or context.timeout or self.timeout  # the model's own, the worker's, the default
        client = client_for(self.resolved_base_url(), api_key, timeout, self.max_retries, self.organization)
        params, options = self.request(messages, tools, context)
        limit = options.get("timeout", timeout)
        call_timeout = limit if isinstance(limit, int | float) else None
        if context.on_delta is not None:
            from orchestrator.models._streaming import stream_reply

            return stream_reply(self, client, params, options, context.on_delta, api_key=api_key, timeout=call_timeout)
        raw = guarded_call(
            lambda: self.send(client, params, options), model=self, api_key=api_key, timeout=call_timeout
        )
        return read_guarded(self, api_key, self.read_reply, raw)

    def _bad_key(self, problem: str) -> ModelCallError:
        if self._api_key:
            where, fix = "the API key passed as api_key=", "pass the key exactly as issued"
        else:
            where = f"the API key in {API_KEY_VAR}"
            fix = f"set {API_KEY_VAR} again, exactly as issued, in the environment of the workers"
        return ModelCallError(
            f"{self.describe()}: {where} has {problem}; a key is printable ASCII without spaces: {fix}",
            retryable=False,
            kind="AuthenticationError",
        )

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


def _package(exc: BaseException) -> str:
    return type(exc).__module__.partition(".")[0]


def _safe(text: str) -> str:
    # Text Ratchet writes itself must be storable: no lone surrogates, no NUL.
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _finite(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
