"""The anthropic clients of a process, and how a call through one fails, classified.

Clients are cached per process and per (base URL, key, timeout, retries) in the cache the openai
ones have (`orchestrator.models._clients.ClientCache`). Each client's timeout bounds
a whole call (`orchestrator.models._deadline`, on anthropic's own default httpx client). The SDK's
own OpenTelemetry spans are off: Ratchet makes the model call's span (`orchestrator.tracing`).

Failures become `ModelCallError`s by the same rules as OpenAI's (`orchestrator.models.failures`):
429 (Retry-After read), 408, 409, 5xx and Anthropic's 529 `overloaded_error` are retryable, a
connection error or a timeout too, before the reply or mid-stream; 400, 401, 403, 404 and every
other 4xx are final. An error event mid-stream (the SDK raises it as a status error of the
stream's 200) is the provider failing mid-reply, retryable; its `overloaded_error` or
`rate_limit_error` is an OverloadedError or RateLimitError, a rate limit to a fallback. A prompt
too long for the model is final and marked `context_overflow`, for `on_context_overflow`. An
exception the caller's runtime raised during the call (Celery's soft time limit), which the SDK
wraps as a connection error, propagates as it is.

`anthropic` is imported on first use only: importing an agent definition costs no SDK import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.errors import ModelCallError
from orchestrator.models._clients import ClientCache
from orchestrator.models._keys import redact
from orchestrator.models.base import Model
from orchestrator.models.failures import (
    injected,
    is_call_error,
    is_context_length_error,
    sdk_error,
    stream_error,
    translate_call_error,
)

if TYPE_CHECKING:
    import anthropic

#: Where `Claude` reads the API key when none is passed, at each call.
API_KEY_VAR = "ANTHROPIC_API_KEY"
_OVERFLOW_HINTS = ("prompt is too long", "exceed context limit")
#: Anthropic's error types that mean "too many requests", as the kinds of their statuses (529, 429).
_STREAM_KINDS = {"overloaded_error": "OverloadedError", "rate_limit_error": "RateLimitError"}
_clients: ClientCache[anthropic.Anthropic] = ClientCache()


def claude_client(base_url: str, api_key: str, timeout: float, max_retries: int) -> anthropic.Anthropic:
    """A cached `anthropic.Anthropic` for these settings in this process; `timeout` bounds a whole call."""

    def build() -> anthropic.Anthropic:
        import anthropic

        from orchestrator.models._deadline import deadline_client

        return anthropic.Anthropic(
            api_key=api_key,
            base_url=base_url,
            timeout=timeout,
            max_retries=max_retries,
            open_telemetry=False,
            http_client=deadline_client(timeout, anthropic.DefaultHttpxClient),
        )

    return _clients.get(api_key, (base_url, timeout, max_retries), build)


def claude_failure(exc: Exception, *, model: Model, api_key: str | None, timeout: float | None) -> BaseException | None:
    """What a call that raised `exc` raises instead: a classified `ModelCallError`, or the
    exception the caller's runtime injected; None when `exc` is not the call's and must propagate."""
    import anthropic

    if isinstance(exc, anthropic.AnthropicError):
        if isinstance(exc, anthropic.APIConnectionError) and (cause := injected(exc.__cause__)) is not None:
            return cause
        return _translate(exc, model=model, api_key=api_key, timeout=timeout)
    import httpx2

    if isinstance(exc, httpx2.TransportError):
        # A stream cut mid-way, or past its deadline: anthropic's `Stream` lets httpx's error out
        # as it is (before the first event the SDK wraps it as a connection or timeout error).
        kind = "APITimeoutError" if isinstance(exc, httpx2.TimeoutException) else "APIConnectionError"
        limit = (
            f" (no whole reply within {timeout:g}s, the limit of one call)"
            if kind == "APITimeoutError" and timeout
            else ""
        )
        detail = redact(str(exc), api_key)[:300]
        return ModelCallError(
            f"{model.describe()}: {kind}: the stream broke off: {detail}{limit}", retryable=True, kind=kind
        )
    if not is_call_error(exc):
        return None
    return translate_call_error(exc, model=model, api_key=api_key)


def is_context_overflow(message: str) -> bool:
    """Whether Anthropic's error text says the conversation does not fit the model ("prompt is too
    long: N tokens > M maximum", "input length and `max_tokens` exceed context limit")."""
    text = message.lower()
    return any(hint in text for hint in _OVERFLOW_HINTS) or is_context_length_error(None, text)


def _stream_error(model: Model, error_type: str | None, detail: str) -> ModelCallError:
    """An `error` event mid-stream; Anthropic's overloaded and rate-limit types keep their class
    (retryable, and a rate limit to a fallback), as the same error before the stream would."""
    kind = _STREAM_KINDS.get(error_type or "")
    if kind is None:
        error = stream_error(model, error_type, detail, None)
        error.context_overflow = is_context_overflow(detail)
        error.retryable = error.retryable and not error.context_overflow
        return error
    return ModelCallError(
        f"{model.describe()}: {kind}: the stream reported an error ({error_type}): {detail}",
        retryable=True,
        kind=kind,
    )


def _translate(
    exc: anthropic.AnthropicError, *, model: Model, api_key: str | None, timeout: float | None
) -> ModelCallError:
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        detail = redact(str(exc.api_message or exc.message), api_key)
        if exc.status_code < 400:
            # An `error` event in a stream that had started (its response is the stream's 200).
            return _stream_error(model, exc.type, detail)
    else:
        detail = redact(str(getattr(exc, "message", None) or exc), api_key)
    overflow = isinstance(exc, anthropic.APIStatusError) and exc.status_code == 400 and is_context_overflow(detail)
    return sdk_error(
        exc, anthropic, model=model, detail=detail, timeout=timeout, key_var=API_KEY_VAR, overflow=overflow
    )
