"""Retry policy for transient model errors: a pure function from (attempt, error) to a decision.

Exponential backoff with full jitter, capped, and a provider's Retry-After always honoured
(never retried sooner than it asks). The task only turns the decision into a re-enqueue.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RetryDecision:
    """Whether to retry, and after how many seconds."""

    retry: bool
    delay: float = 0.0


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Backoff: base * factor**attempt, jittered into [delay/2, delay], at most `max_delay`."""

    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 60.0

    def decide(
        self,
        *,
        retries_so_far: int,
        limit: int,
        retryable: bool,
        retry_after: float | None,
        rng: random.Random | None = None,
    ) -> RetryDecision:
        """The decision for a failed call after `retries_so_far` retries of this step."""
        if not retryable or retries_so_far >= limit:
            return RetryDecision(retry=False)
        ceiling = min(self.max_delay, self.base * self.factor**retries_so_far)
        jittered = ceiling / 2 + (rng or random).random() * ceiling / 2
        delay = max(jittered, retry_after or 0.0)
        return RetryDecision(retry=True, delay=delay)
