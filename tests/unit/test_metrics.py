"""`Metrics`: a call's usage as reported and costed, and totals in which unknown stays unknown."""

from __future__ import annotations

import pytest

from orchestrator.messages import Message
from orchestrator.models.base import ModelReply
from orchestrator.usage import Metrics, Prices


def test_a_reported_usage_is_costed_per_million_tokens() -> None:
    usage = {"input_tokens": 1_000, "output_tokens": 500, "cached_tokens": 200, "reasoning_tokens": 100}
    metrics = Metrics.reported(usage, Prices(input=2.0, output=8.0))
    assert metrics == Metrics(
        input_tokens=1_000, output_tokens=500, cache_read_tokens=200, reasoning_tokens=100, cost=0.006
    )
    assert metrics is not None and metrics.total_tokens == 1_500


def test_without_prices_or_usage_the_cost_or_the_metrics_are_unknown() -> None:
    assert Metrics.reported({"input_tokens": 3, "output_tokens": 4}) == Metrics(input_tokens=3, output_tokens=4)
    assert Metrics.reported({}, Prices(input=1, output=1)) is None
    assert ModelReply(content="hi").to_message().metrics is None


def test_a_total_with_an_unknown_part_is_unknown_field_by_field() -> None:
    known = Metrics(input_tokens=3, output_tokens=4, cache_read_tokens=1, reasoning_tokens=0, cost=0.5)
    no_cost = Metrics(input_tokens=2, output_tokens=1, cache_read_tokens=0, reasoning_tokens=0)
    assert Metrics.total([known, no_cost]) == Metrics(
        input_tokens=5, output_tokens=5, cache_read_tokens=1, reasoning_tokens=0, cost=None
    )
    assert Metrics.total([known, None]) == Metrics()
    assert Metrics.total([]) == Metrics(
        input_tokens=0, output_tokens=0, cache_read_tokens=0, cache_write_tokens=0, reasoning_tokens=0, cost=0.0
    )


@pytest.mark.parametrize("metrics", [None, Metrics(input_tokens=7, output_tokens=2, cost=0.25)])
def test_a_messages_usage_survives_its_row(metrics: Metrics | None) -> None:
    row = Message(role="assistant", content="x", metrics=metrics).to_row()
    stored = type("Row", (), {**row, "created_at": 1.0, "tool_calls": None, "tool_args": None})
    assert Message.from_row(stored).metrics == metrics
