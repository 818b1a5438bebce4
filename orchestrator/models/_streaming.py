"""Streamed calls of the OpenAI adapters: the reply read event by event, each piece of its text
handed to the caller as it arrives, and at the end the same `ModelReply` the whole reply gives.

A streamed call is the same request with `stream: true`; each adapter's `StreamReader` builds the
reply from its API's events. Failures are classified as a whole call's are: an HTTP error before
the stream starts is the SDK's status error; a stream cut mid-way (a connection dropped, the
deadline of `orchestrator.models._deadline` passing between two chunks) is the SDK's connection
or timeout error, retryable; an error event mid-way is the provider failing mid-reply, retryable
like a 5xx unless the conversation no longer fits; a stream that ends before its reply is
complete, or an event that cannot be read, is a malformed reply, retryable.

An exception `on_delta` raises is the caller's, not the model's: it propagates as it is, and the
stream is closed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.messages import ToolCall
from orchestrator.models.base import Model, ModelReply
from orchestrator.models.failures import Classify, call_failure, guarded_call, read_guarded, stream_error


class StreamReader(ABC):
    """Builds one reply from a stream's events, fed in order."""

    @abstractmethod
    def feed(self, event: Any) -> str | None:
        """Take the next event; return the text it adds to the reply, if any."""

    @abstractmethod
    def reply(self) -> ModelReply:
        """The whole reply once the stream has ended; `ValueError` if it ended before the reply did."""


@dataclass(kw_only=True)
class PartialCall:
    """A tool call whose id and name came in one event and whose arguments come in fragments."""

    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)

    def done(self) -> ToolCall:
        """The call as a whole reply carries it (a `ValidationError` without an id or a name)."""
        # Invalid JSON is not an error here: the engine reports it to the model as a tool error.
        return ToolCall.model_validate({"id": self.id, "name": self.name, "arguments": "".join(self.arguments) or "{}"})


class EventStream(Protocol):
    """A stream of events as the SDKs return it (`openai.Stream`, `anthropic.Stream`)."""

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


def stream_reply(
    model: Model,
    open_stream: Callable[[], EventStream],
    reader: StreamReader,
    on_delta: Callable[[str], None],
    *,
    api_key: str | None,
    timeout: float | None,
    classify: Classify | None = None,
) -> ModelReply:
    """Make one streamed call (`open_stream()` sends it): `on_delta(text)` per piece of text as it
    arrives, then the reply `reader` built from the events. `classify` makes a failure of the
    call or mid-stream a `ModelCallError` (openai's `stream_failure` unless another SDK's is given)."""
    classify = classify or stream_failure
    stream = guarded_call(open_stream, model=model, api_key=api_key, timeout=timeout, classify=classify)
    with stream:
        for event in _events(stream, classify, model=model, api_key=api_key, timeout=timeout):
            text = read_guarded(model, api_key, reader.feed, event)
            if text:
                on_delta(text)
    return read_guarded(model, api_key, reader.reply)


def _events(
    stream: EventStream, classify: Classify, *, model: Model, api_key: str | None, timeout: float | None
) -> Iterator[Any]:
    events = iter(stream)
    while True:
        failure: BaseException | None = None
        try:
            event = next(events)
        except StopIteration:
            return
        except Exception as exc:
            failure = classify(exc, model=model, api_key=api_key, timeout=timeout)
            if failure is None:
                raise
        if failure is not None:
            raise failure
        if isinstance(event, dict) and event.get("type") == "error":
            # The Responses API's error event (Chat's is the SDK's `APIError`: `stream_failure`).
            raise stream_error(model, event.get("code"), str(event.get("message")), api_key)
        yield event


def stream_failure(exc: Exception, *, model: Model, api_key: str | None, timeout: float | None) -> BaseException | None:
    """`call_failure` for openai's streams: the SDK's bare `APIError` is an `{"error": ...}`
    event mid-stream (no status, no transport failure), the provider failing mid-reply."""
    import openai

    if type(exc) is openai.APIError:
        return stream_error(model, exc.code, exc.message, api_key)
    return call_failure(exc, model=model, api_key=api_key, timeout=timeout)
