"""The model port: what the engine asks of a language model, and how a model reports failure.

A model is runtime configuration that each worker process rebuilds from the agent's definition;
nothing of it crosses the broker. `invoke` makes one call and returns a `ModelReply`, or raises
`ModelCallError` whose `retryable` flag (and `retry_after`) the retry policy reads.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from orchestrator.errors import ConfigurationError, ModelCallError
from orchestrator.messages import Message, ToolCall
from orchestrator.usage import Metrics, Prices


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool as the model sees it: a name, a description and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class OutputFormat:
    """The JSON schema a reply must follow (an agent's `output_schema`), strict as OpenAI's
    structured outputs want it: the adapter asks for it the way its API does."""

    name: str
    schema: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class CallContext:
    """Who is calling: sent to the model as headers so a test server can count calls per step."""

    run_id: str
    seq: int
    #: The HTTP timeout the worker's settings give one call (RATCHET_MODEL_TIMEOUT, read once when
    #: the worker starts); a model's own `timeout=` wins, and None means that setting's default.
    timeout: float | None = None
    #: Called with each piece of the reply's text as it arrives; when set, the model streams its reply.
    on_delta: Callable[[str], None] | None = None
    #: When set, the reply's text must be JSON that follows this schema.
    output: OutputFormat | None = None

    def headers(self) -> dict[str, str]:
        """Headers that name the run and step (harmless to real providers)."""
        return {"X-Ratchet-Run-Id": self.run_id, "X-Ratchet-Step": str(self.seq)}


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """A provider's limits on one model, kept by every worker together (`orchestrator.limits`): at
    most `requests` calls and `tokens` tokens (prompt and reply) per `per` seconds, None meaning
    no such limit. A call that would go past one waits parked, holding no worker. With neither
    number, only the provider's 429s are shared: every worker waits out a Retry-After."""

    requests: int | None = None
    tokens: int | None = None
    per: float = 60.0

    def __post_init__(self) -> None:
        for name in ("requests", "tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"RateLimit({name}=...) must be a whole number, 1 or more; got {value!r}")
        if isinstance(self.per, bool) or not isinstance(self.per, int | float) or not self.per > 0:
            raise ConfigurationError(f"RateLimit(per=...) must be a positive number of seconds; got {self.per!r}")


@dataclass(frozen=True, kw_only=True)
class ModelReply:
    """What one model call produced: text, tool calls, or both."""

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    #: The tokens the provider reported: `input_tokens`, `output_tokens`, and when it says them
    #: `cached_tokens` and `reasoning_tokens`; empty when it reported none.
    usage: dict[str, int] = field(default_factory=dict)
    #: What the provider said of the reply, for traces (`orchestrator.tracing`); None if it did
    #: not say: the model that answered, the reply's id (not part of its value: two calls that
    #: answer alike are equal), and why it stopped ("stop", "tool_calls", "length"...).
    response_model: str | None = None
    response_id: str | None = field(default=None, compare=False)
    finish_reason: str | None = None

    def to_message(self, prices: Prices | None = None) -> Message:
        """The assistant message this reply becomes in the transcript, with its usage (and its
        cost at `prices`)."""
        return Message(
            role="assistant",
            content=self.content,
            tool_calls=[c.to_openai() for c in self.tool_calls] or None,
            metrics=Metrics.reported(self.usage, prices),
            model=self.response_model,
        )


class Model(ABC):
    """A language model adapter. Subclasses implement `invoke`; they must not keep secrets in
    anything that is persisted or sent to the broker."""

    id: str
    #: What the model's tokens cost per million; None: costs are unknown.
    prices: Prices | None = None
    #: The provider's limits on this model id, shared by every worker; None: not limited.
    rate_limit: RateLimit | None = None
    #: Who serves it, as OpenTelemetry's GenAI conventions name providers (`gen_ai.provider.name`:
    #: "openai", "anthropic"...); None if unknown.
    provider: str | None = None

    @abstractmethod
    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        """Make one call. Raise `ModelCallError` (retryable or final) when it fails."""

    #: Where calls go when the model was given a server of its own (`base_url=`); None: its
    #: provider's, or its SDK's variable.
    base_url: str | None = None

    def describe(self) -> str:
        """A short, secret-free description for logs and `ratchet show`: the class, the model id
        and, if set, the base URL without what may carry a credential."""
        if not self.base_url:
            return f"{type(self).__name__}(id={self.id!r})"
        return f"{type(self).__name__}(id={self.id!r}, base_url={credential_free(self.base_url)!r})"

    def span_attributes(self) -> dict[str, Any]:
        """What the span of a call says about the request besides the model id (`orchestrator.tracing`),
        keyed as OpenTelemetry's GenAI conventions say: the server, sampling settings. Never a key
        or the prompt."""
        return {}


def credential_free(url: str) -> str:
    """`url` without its userinfo, query and fragment: where credentials hide in URLs."""
    parts = urlsplit(url)
    netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


__all__ = [
    "CallContext",
    "Model",
    "ModelCallError",
    "ModelReply",
    "OutputFormat",
    "Prices",
    "RateLimit",
    "ToolSpec",
]
