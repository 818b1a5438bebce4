"""Token usage and its cost, with Agno's names: `Metrics` of one model call, of a run, of a session.

Each assistant message stores the usage the provider reported for the call that produced it.
A count the provider did not report as a whole number (`count`), or a row written before
migration 0005, is None, unknown (never 0):
a total of counts one of which is unknown is unknown too, never a smaller number that looks
exact. Input tokens include the cached ones (read from the provider's prompt cache, and, for
Anthropic, written to it: `cache_write_tokens`, migration 0019) and output tokens the reasoning
ones, as OpenAI counts them.

The cost is computed when the message is made, from the model's `Prices`, and stored with the
tokens: it is what the call cost at the prices the worker ran with, and a reader needs neither
the agent's definition nor today's price list to total it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

#: The columns of a message row that hold its usage, in `Metrics`' field order.
USAGE_COLUMNS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "cost")
#: The columns of a message row that say how long the call that made it took (migration 0018):
#: `Metrics.duration` and `.time_to_first_token`.
TIMING_COLUMNS = ("duration", "time_to_first_token")


#: The largest token count stored: the token columns are 32-bit integers.
MAX_TOKENS = 2**31 - 1


def reported_usage(input: object, output: object, cached: object = None, reasoning: object = None) -> dict[str, int]:
    """`ModelReply.usage` from the counts a provider sent; a count it did not send as a whole
    number is left out, unknown, never 0 (`count`). The adapters read the counts from the JSON
    the provider sent, which nothing validated (`orchestrator.models._json`), so this is where a
    bad count stops: as unknown, instead of failing the step or the commit, or reading as an
    exact 0."""
    counts = dict(input_tokens=input, output_tokens=output, cached_tokens=cached, reasoning_tokens=reasoning)
    return {name: n for name, value in counts.items() if (n := count(value)) is not None}


def count(value: object) -> int | None:
    """A token count as a provider sent it: a whole number from 0 to MAX_TOKENS, a JSON integer
    or a float without a fraction (12.0: JSON has one number type, and some servers write
    counts that way); None for anything else: null, a string, a list, a bool, 3.5, a negative
    or an overflowing count."""
    if isinstance(value, bool):  # an int to Python, not a count
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and 0 <= value <= MAX_TOKENS else None


@dataclass(frozen=True, kw_only=True)
class Prices:
    """What a model's tokens cost, in US dollars per million, as the providers publish their
    prices: `OpenAIChat(id=..., prices=Prices(input=2.5, output=10))`, or with the prompt cache's
    own rates, `Claude(id=..., prices=Prices(input=3, output=15, cache_read=0.3, cache_write=3.75))`.
    Costs are in US dollars (`ratchet_cost_usd_total`)."""

    #: US dollars per million input tokens (the cached ones too, unless their rates are given).
    input: float
    #: US dollars per million output tokens (reasoning ones included).
    output: float
    #: US dollars per million input tokens read from the prompt cache; None: the input rate.
    cache_read: float | None = None
    #: US dollars per million input tokens written to the prompt cache (Anthropic's cache
    #: creation); None: the input rate.
    cache_write: float | None = None

    def cost(
        self, input_tokens: int, output_tokens: int, cache_read_tokens: int = 0, cache_write_tokens: int = 0
    ) -> float:
        """The cost of one call's tokens, in US dollars: `input_tokens` holds the cached ones,
        which are costed at their own rates where given."""
        fresh = max(0, input_tokens - cache_read_tokens - cache_write_tokens)
        read = self.input if self.cache_read is None else self.cache_read
        write = self.input if self.cache_write is None else self.cache_write
        cents = fresh * self.input + cache_read_tokens * read + cache_write_tokens * write + output_tokens * self.output
        return cents / 1_000_000


class Metrics(BaseModel):
    """Token counts, cost and timing of a call (Agno's `Metrics` names); None where unknown. A
    reply's are its model call's; a tool result's only its `duration`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    #: Input tokens written to the prompt cache (Anthropic reports them); None where not reported.
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None
    #: In US dollars, at the model's prices; None without prices or without the token counts.
    cost: float | None = None
    #: Seconds the call took (the model call, or the tool call), as the worker timed it.
    duration: float | None = None
    #: Seconds from a streamed model call to its first text; None for a call not streamed.
    time_to_first_token: float | None = None

    @property
    def total_tokens(self) -> int | None:
        """Input and output tokens together, or None if either is unknown."""
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return self.input_tokens + self.output_tokens

    @classmethod
    def reported(cls, usage: Mapping[str, int], prices: Prices | None = None) -> Metrics | None:
        """A call's metrics from the usage a model adapter parsed (`ModelReply.usage`); None when
        the provider reported none."""
        if not usage:
            return None
        tokens_in, tokens_out = usage.get("input_tokens"), usage.get("output_tokens")
        read, written = usage.get("cached_tokens"), usage.get("cache_write_tokens")
        cost = None
        if prices is not None and tokens_in is not None and tokens_out is not None:
            cost = prices.cost(tokens_in, tokens_out, read or 0, written or 0)
        return cls(
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cache_read_tokens=read,
            cache_write_tokens=written,
            reasoning_tokens=usage.get("reasoning_tokens"),
            cost=cost,
        )

    @classmethod
    def total(cls, parts: Iterable[Metrics | None]) -> Metrics:
        """The sum of `parts` field by field; a field is None if it is None in any part (an
        unknown part makes the total unknown). No parts: all zero. Timings are per call: not
        totalled (None)."""
        sums: dict[str, int | float | None] = dict.fromkeys(USAGE_COLUMNS, 0)
        for part in parts:
            for name in USAGE_COLUMNS:
                value = None if part is None else getattr(part, name)
                current = sums[name]
                sums[name] = None if value is None or current is None else current + value
        return cls.model_validate(sums)
