"""The retry policy is a pure decision."""

from __future__ import annotations

import random

from orchestrator.retry import RetryPolicy


def test_final_errors_are_never_retried() -> None:
    assert not RetryPolicy().decide(retries_so_far=0, limit=3, retryable=False, retry_after=None).retry


def test_retries_stop_at_the_agents_limit() -> None:
    assert not RetryPolicy().decide(retries_so_far=3, limit=3, retryable=True, retry_after=None).retry


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    policy = RetryPolicy(base=1.0, factor=2.0, max_delay=10.0)
    rng = random.Random(7)
    delays = [
        policy.decide(retries_so_far=n, limit=99, retryable=True, retry_after=None, rng=rng).delay for n in range(6)
    ]
    for n, delay in enumerate(delays):
        ceiling = min(10.0, 2.0**n)
        assert ceiling / 2 <= delay <= ceiling


def test_retry_after_is_honoured_even_when_longer_than_the_backoff() -> None:
    decision = RetryPolicy(base=0.1).decide(retries_so_far=0, limit=3, retryable=True, retry_after=120.0)
    assert decision.retry and decision.delay == 120.0
