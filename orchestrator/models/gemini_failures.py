"""How a call through Google's `google-genai` SDK fails, classified into Ratchet's `ModelCallError`
as `orchestrator.models.failures` classifies the openai client's failures, with no key in its text.

An HTTP status (the SDK's `APIError`: `ClientError` for 4xx, `ServerError` for 5xx, raised for an
error reply and for an `{"error": ...}` chunk mid-stream) is retryable as `retryable_status` says:
429 RESOURCE_EXHAUSTED, 5xx (500 INTERNAL, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED), 408 and 409;
every other 4xx is final. A 429's wait is its `Retry-After` header, else the `RetryInfo` detail
of Google's error body (`"retryDelay": "37s"`). Gemini refuses a bad key with 400 and the reason
API_KEY_INVALID: that is an `AuthenticationError` like a 401. The transport failing (the SDK lets
httpx2's errors through: a refused connection, a connection dropped mid-reply, the whole-call
deadline of `orchestrator.models._deadline` passing) is retryable; a body that is not the JSON of a
reply is malformed, retryable; anything else the call raised is the model's settings, final. An
exception the caller's runtime injects (Celery's soft time limit) propagates as it is.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from orchestrator.errors import ModelCallError
from orchestrator.models._keys import redact
from orchestrator.models.base import Model
from orchestrator.models.failures import (
    is_call_error,
    is_context_length_error,
    kind_for_status,
    malformed,
    parse_retry_after,
    status_error,
    translate_call_error,
)

#: Where the Gemini adapter reads its key, in the order the SDK reads them: the first set wins.
KEY_VARS = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
_TIMEOUT_VAR = "RATCHET_MODEL_TIMEOUT"
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
#: Gemini's words for a prompt past the model's context ("The input token count (N) exceeds the
#: maximum number of tokens allowed (M)"): final, and `context_overflow` for a fallback.
_OVERFLOW_HINT = "exceeds the maximum number of tokens"

T = TypeVar("T")


def guarded(call: Callable[[], T], *, model: Model, api_key: str | None, timeout: float | None) -> T:
    """`call()`, whose failure is raised as `gemini_failure` makes it, outside the except block (the
    SDK's exception, whose text may hold the request, is not chained into tracebacks and logs)."""
    try:
        return call()
    except Exception as exc:
        failure = gemini_failure(exc, model=model, api_key=api_key, timeout=timeout)
        if failure is None:
            raise
    raise failure


def gemini_failure(exc: Exception, *, model: Model, api_key: str | None, timeout: float | None) -> BaseException | None:
    """The `ModelCallError` a call that raised `exc` raises instead; None when `exc` is not the call's."""
    import httpx2
    import pydantic
    from google.genai import errors

    if isinstance(exc, ModelCallError):
        return exc
    if isinstance(exc, errors.APIError):
        return api_error(exc, model=model, api_key=api_key)
    kind = type(exc).__name__
    detail = redact(str(exc), api_key)[:300]
    if isinstance(exc, httpx2.TimeoutException):
        limit = (
            f" (no whole reply within {timeout:g}s, the limit of one call: the model's timeout=, else {_TIMEOUT_VAR})"
        )
        return ModelCallError(
            f"{model.describe()}: APITimeoutError: {kind}: {detail}{limit if timeout is not None else ''}",
            retryable=True,
            kind="APITimeoutError",
        )
    if isinstance(exc, httpx2.TransportError):
        return ModelCallError(
            f"{model.describe()}: APIConnectionError: {kind}: {detail}", retryable=True, kind="APIConnectionError"
        )
    if isinstance(exc, errors.UnknownApiResponseError | json.JSONDecodeError | pydantic.ValidationError):
        return malformed(model, f"{kind}: {detail}")
    if not (is_call_error(exc) or type(exc).__module__.startswith("google.")):
        return None
    return translate_call_error(exc, model=model, api_key=api_key)


def api_error(exc: Any, *, model: Model, api_key: str | None) -> ModelCallError:
    """A `ModelCallError` for the SDK's `APIError` (an HTTP status and Google's error body)."""
    code = exc.code if isinstance(exc.code, int) else 0
    status = str(exc.status or "")
    detail = redact(str(exc.message or exc.details or exc), api_key)[:500]
    bad_key = code == 401 or "API_KEY_INVALID" in _reasons(exc.details)
    return status_error(
        model,
        "AuthenticationError" if bad_key else kind_for_status(code),
        code,
        detail,
        retry_after=retry_delay(exc),
        key_vars=KEY_VARS,
        overflow=_OVERFLOW_HINT in detail.lower() or is_context_length_error(status, detail),
        status_name=status,
        bad_key=bad_key,
    )


def retry_delay(exc: Any) -> float | None:
    """Seconds to wait before a retry: the reply's `Retry-After`, else its body's `RetryInfo`."""
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if headers is not None:
        try:
            waited = parse_retry_after(dict(headers))
        except (TypeError, ValueError):
            waited = None
        if waited is not None:
            return waited
    for detail in _details(exc.details):
        if detail.get("@type") == _RETRY_INFO:
            return _duration(detail.get("retryDelay"))
    return None


def _details(body: Any) -> list[dict[str, Any]]:
    error = body.get("error", body) if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    return [d for d in details if isinstance(d, dict)] if isinstance(details, list) else []


def _reasons(body: Any) -> set[str]:
    return {str(d.get("reason")) for d in _details(body) if d.get("@type") == _ERROR_INFO}


def _duration(value: Any) -> float | None:
    """A protobuf Duration as JSON writes it ("37s", "1.500s") in seconds; None if it is not one."""
    if not isinstance(value, str) or not value.endswith("s"):
        return None
    try:
        seconds = float(value[:-1])
    except ValueError:
        return None
    return seconds if 0 <= seconds < float("inf") else None
