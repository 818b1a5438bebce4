"""How a call to an OpenAI-compatible API fails, classified: each failure becomes a
`ModelCallError` that says whether a retry may help and holds no key in its text.

An HTTP status is final or retryable as `retryable_status` says (a conversation that no longer fits
the model is final whatever its status); a reply that cannot be read is malformed, retryable; a
failure of the call itself before a reply (a bad header, a body that is not JSON) is the model's
settings, final. An exception the caller's runtime injects into the call (Celery's soft time
limit) is not the call's error: it propagates as it is, even from an SDK that wraps it as a
connection error. The scripted model of `orchestrator.testing` fails the same way through these.

`openai` is imported lazily, as in the adapters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from orchestrator.errors import ModelCallError
from orchestrator.models._keys import API_KEY_VAR, redact
from orchestrator.models.base import Model

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
    ArithmeticError,
    AssertionError,
    AttributeError,
    LookupError,
    OSError,
    RuntimeError,
    TypeError,
    ValueError,
)
_STACK_PACKAGES = _TRANSPORT_PACKAGES | {"openai", "anthropic", "pydantic", "pydantic_core", "jiter"}
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

    return injected(exc.__cause__) if isinstance(exc, openai.APIConnectionError) else None


def injected(cause: BaseException | None) -> BaseException | None:
    """`cause`, the cause of an SDK's connection error, if it is no network failure (an
    exception the caller's runtime raised during the call, which the SDK wrapped), else None."""
    if cause is None or isinstance(cause, OSError):
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

    detail = redact(str(getattr(exc, "message", None) or exc), api_key)
    overflow = is_context_length_error(getattr(exc, "code", None), detail)
    return sdk_error(exc, openai, model=model, detail=detail, timeout=timeout, key_var=API_KEY_VAR, overflow=overflow)


def sdk_error(
    exc: Exception, sdk: Any, *, model: Model, detail: str, timeout: float | None, key_var: str, overflow: bool
) -> ModelCallError:
    """What an exception of the openai or the anthropic SDK (`sdk`, the module: both have the same
    classes) becomes, `detail` its text without the key: a reply the SDK could not validate is
    malformed; a timeout or a connection error retryable (the request may not have reached the
    provider, or it was slow); an HTTP status as `status_error` says (`overflow`: the provider
    said the conversation does not fit the model); anything else final."""
    kind = type(exc).__name__
    where = model.describe()
    if isinstance(exc, sdk.APIResponseValidationError):
        return malformed(model, detail)
    if isinstance(exc, sdk.APITimeoutError) and timeout is not None:
        limit = f"no whole reply within {timeout:g}s, the limit of one call: the model's timeout=, else {_TIMEOUT_VAR}"
        return ModelCallError(f"{where}: {kind}: {detail} ({limit})", retryable=True, kind=kind)
    if isinstance(exc, sdk.APIConnectionError):  # APITimeoutError is one
        return ModelCallError(f"{where}: {kind}: {detail}", retryable=True, kind=kind)
    if isinstance(exc, sdk.APIStatusError):
        retry_after = parse_retry_after(exc.response.headers)
        return status_error(
            model, kind, exc.status_code, detail, retry_after=retry_after, key_vars=(key_var,), overflow=overflow
        )
    return ModelCallError(f"{where}: {kind}: {detail}", retryable=False, kind=kind)


def status_error(
    model: Model,
    kind: str,
    status: int,
    detail: str,
    *,
    retry_after: float | None,
    key_vars: Sequence[str],
    overflow: bool = False,
    status_name: str = "",
    bad_key: bool = False,
) -> ModelCallError:
    """The error for a reply with an HTTP error status, whatever the provider: retryable as
    `retryable_status` says, unless the conversation does not fit the model (`overflow`: final
    whatever its status); a 401, a 403 or another refusal of the key (`bad_key`) says which
    variables to check; `status_name` is the provider's own name of the status, if it has one."""
    hint = (
        f" (check {' or '.join(key_vars)} in the environment of the workers)" if bad_key or status in (401, 403) else ""
    )
    return ModelCallError(
        f"{model.describe()}: {kind} (HTTP {status}{f' {status_name}' if status_name else ''}){hint}: {detail}",
        retryable=retryable_status(status) and not overflow,
        status_code=status or None,
        retry_after=retry_after,
        kind=kind,
        context_overflow=overflow,
    )


#: What a call that raised an exception raises instead (`call_failure` for openai's SDK).
Classify = Callable[..., BaseException | None]


def guarded_call(
    call: Callable[[], T],
    *,
    model: Model,
    api_key: str | None,
    timeout: float | None,
    classify: Classify | None = None,
) -> T:
    """`call()`, whose failure is raised as `classify` (openai's `call_failure` unless another
    SDK's is given) makes it: outside the except block, so the SDK's exception (whose text or
    arguments may hold the key, as a UnicodeEncodeError's do) is not chained into tracebacks and logs."""
    try:
        return call()
    except Exception as exc:
        failure = (classify or call_failure)(exc, model=model, api_key=api_key, timeout=timeout)
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


def stream_error(model: Model, code: str | None, message: str, api_key: str | None) -> ModelCallError:
    """The error for an error event in a stream: the provider failed mid-reply."""
    detail = redact(message, api_key)[:300]
    overflow = is_context_length_error(code, detail)
    return ModelCallError(
        f"{model.describe()}: the stream reported an error{f' ({code})' if code else ''}: {detail}",
        retryable=not overflow,
        kind="StreamError",
        context_overflow=overflow,
    )


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
