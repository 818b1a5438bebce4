"""Fallback models, in Agno's shape: the models a step calls when its agent's model fails.

    Agent(name="a", model=OpenAIChat(id="gpt-5.4"), fallback_models=[OpenAIChat(id="gpt-5.4-mini")])
    Agent(name="a", model=..., fallback_config=FallbackConfig(on_rate_limit=[...], on_error=[...]))

A model's failure leads to a fallback only once that model is done with: a final error, or a
retryable one whose retries (the agent's `retries`, per model) are spent. Which list is tried
depends on the primary model's error, as Agno sorts it (`fallback_class`):

- "rate_limit": the provider said too many requests (HTTP 429, or 529 overloaded);
- "context_overflow": the conversation no longer fits the model (the adapter marks it,
  `ModelCallError.context_overflow`, from its provider's words; else OpenAI's are looked for);
- "error": any other error retries could not fix (5xx, timeouts, connection errors, malformed
  replies). A client error (400, 401, 403, 404, 422...) is None: a configuration to fix, which
  no other model would fix, so it is never hidden behind a fallback.

`on_rate_limit` and `on_context_overflow` are tried for their class, and `on_error` for every
class when its own list is empty. Once a list is chosen, its models are tried in order whatever
they fail with; when the last fails, the step fails with each model's error.

A step's place in its chain is an index (`FallbackChain.models`: the primary at 0, then
`on_error`, `on_rate_limit`, `on_context_overflow`), which the step stores with its run so that
a crash resumes on the model it was trying.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from orchestrator.errors import ConfigurationError, ModelCallError
from orchestrator.models.base import Model
from orchestrator.models.failures import is_context_length_error

FallbackClass = Literal["error", "rate_limit", "context_overflow"]
#: The lists of a `FallbackConfig`, in the order their models are numbered in a chain.
LISTS: tuple[tuple[str, FallbackClass], ...] = (
    ("on_error", "error"),
    ("on_rate_limit", "rate_limit"),
    ("on_context_overflow", "context_overflow"),
)
#: The kinds of a client error raised without a status (a key refused before the request).
CLIENT_ERRORS = frozenset({"AuthenticationError", "PermissionDeniedError"})
#: Statuses that are a rate limit: 429, and Anthropic's 529 (overloaded), as Agno counts them.
RATE_LIMIT_STATUSES = frozenset({429, 529})


@dataclass(frozen=True, kw_only=True)
class FallbackConfig:
    """Which models to try, per class of error (Agno's `FallbackConfig`; see the module docstring).
    Agno's `callback` is left out: a fallback is an event of the run (FallbackModelActivated)."""

    #: Tried when the model fails with any error retries could not fix (not a client error).
    on_error: Sequence[Model] = field(default_factory=tuple)
    #: Tried first when it was rate limited (429, 529) past its retries.
    on_rate_limit: Sequence[Model] = field(default_factory=tuple)
    #: Tried first when the conversation does not fit it.
    on_context_overflow: Sequence[Model] = field(default_factory=tuple)

    @property
    def has_fallbacks(self) -> bool:
        return bool(self.on_error or self.on_rate_limit or self.on_context_overflow)


def fallback_class(exc: ModelCallError) -> FallbackClass | None:
    """The class of a failed call, as a fallback sees it; None for a client error."""
    if exc.status_code in RATE_LIMIT_STATUSES or exc.kind in ("RateLimitError", "OverloadedError"):
        return "rate_limit"
    if exc.context_overflow or is_context_length_error(None, str(exc)):
        return "context_overflow"
    if exc.status_code is not None and 400 <= exc.status_code < 500 and not exc.retryable:
        return None
    if exc.kind in CLIENT_ERRORS:  # a key refused before any request was sent: no status
        return None
    return "error"


@dataclass(frozen=True)
class FallbackChain:
    """An agent's model and its fallbacks, numbered: `models[0]` is the agent's own, then each
    list of its config in `LISTS` order; `spans` holds each list's (start, end) in `models`."""

    models: tuple[Model, ...]
    spans: dict[FallbackClass, tuple[int, int]]

    @classmethod
    def of(
        cls, name: str, model: Model, fallback_models: Sequence[Model] | None, config: FallbackConfig | None
    ) -> FallbackChain:
        """The chain of an agent called `name`; ConfigurationError for what cannot be one."""
        if fallback_models is not None and not isinstance(fallback_models, Sequence):
            raise ConfigurationError(f"{name}: fallback_models must be a list of models, got {fallback_models!r}")
        if config is not None and not isinstance(config, FallbackConfig):
            raise ConfigurationError(f"{name}: fallback_config must be a FallbackConfig, got {config!r}")
        config = config or FallbackConfig()
        if fallback_models:
            if config.on_error:
                raise ConfigurationError(
                    f"{name}: fallback_models and fallback_config.on_error name the same list; give one of them"
                )
            config = FallbackConfig(
                on_error=fallback_models,
                on_rate_limit=config.on_rate_limit,
                on_context_overflow=config.on_context_overflow,
            )
        models: list[Model] = [model]
        spans: dict[FallbackClass, tuple[int, int]] = {}
        for attr, klass in LISTS:
            given = getattr(config, attr)
            if isinstance(given, Model | str) or not isinstance(given, Sequence):
                raise ConfigurationError(f"{name}: {attr} must be a list of models, got {given!r}")
            for m in given:
                if not isinstance(m, Model):
                    raise ConfigurationError(
                        f"{name}: a fallback model must be a Model (e.g. OpenAIChat(id=...)), got {m!r} in {attr}"
                    )
            spans[klass] = (len(models), len(models) + len(given))
            models.extend(given)
        return cls(tuple(models), spans)

    def __len__(self) -> int:
        return len(self.models)

    def led_by(self, model: Model) -> FallbackChain:
        """This chain with `model` first: the agent's own model as it is now (a test, or a
        producer, may set `agent.model` after the agent was defined)."""
        return self if self.models[0] is model else FallbackChain((model, *self.models[1:]), self.spans)

    def model(self, index: int) -> Model:
        """The model at `index`; the agent's own for an index this chain does not have (a run
        stored by a deploy that had more fallbacks)."""
        return self.models[index] if 0 <= index < len(self.models) else self.models[0]

    def after(self, index: int, exc: ModelCallError) -> int | None:
        """The index of the model to try after the one at `index` failed for good with `exc`;
        None when there is none (no list for its class, or its list's last model failed)."""
        if index <= 0 or index >= len(self.models):
            klass = fallback_class(exc)
            if klass is None:
                return None
            chosen: FallbackClass
            for chosen in (klass, "error"):
                start, end = self.spans.get(chosen, (0, 0))
                if end > start:
                    return start
            return None
        for start, end in self.spans.values():
            if start <= index < end:
                return index + 1 if index + 1 < end else None
        return None

    def describe(self) -> dict[str, list[dict[str, str | None]]]:
        """Each non-empty list's models (provider, id), as the agent catalog shows them."""
        out: dict[str, list[dict[str, str | None]]] = {}
        for attr, klass in LISTS:
            start, end = self.spans[klass]
            if end > start:
                out[attr] = [{"provider": m.provider, "id": m.id} for m in self.models[start:end]]
        return out
