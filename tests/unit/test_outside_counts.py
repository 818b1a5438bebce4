"""Values from outside that reach the store: a producer's `stream` flag, a listing cursor a client
sends back, and the token counts a provider reports (its SDK does not validate its replies): a
count not sent as a whole number is unknown, never 0."""

from __future__ import annotations

import base64
import json

import pytest

from orchestrator import Agent, InvalidInputError
from orchestrator.models.openai_chat import chat_usage
from orchestrator.models.openai_responses import responses_usage
from orchestrator.testing import InMemoryDispatcher
from orchestrator.usage import Metrics, Prices, count, reported_usage
from tests.support import CountingModel


@pytest.mark.parametrize("stream", ["yes", None, 1])
def test_a_stream_flag_that_is_not_a_bool_is_refused_before_anything_is_written(
    inline: InMemoryDispatcher, stream: object
) -> None:
    agent = Agent(name="flagged", model=CountingModel())
    with pytest.raises(InvalidInputError, match="stream must be true or false"):
        inline.client.start(agent.name, input="hi", run_id="r-flag", stream=stream)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="r-flag"):
        inline.client.get_run("r-flag")


def forged(*values: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(values)).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [forged(1, 1.0, "a\u0000b"), forged(1, 1.0, "\ud800"), forged(1, "1e400", "a"), forged(1, "nan", "a")],
    ids=["nul", "surrogate", "overflow", "nan"],
)
def test_a_forged_cursor_is_invalid_input_not_a_database_error(inline: InMemoryDispatcher, cursor: str) -> None:
    with pytest.raises(InvalidInputError, match="is not one a listing returned"):
        inline.client.list_runs(cursor=cursor)


def test_token_counts_a_provider_sends_that_no_column_holds_read_as_unknown() -> None:
    chat = {
        "prompt_tokens": 2**40, "completion_tokens": -3,
        "prompt_tokens_details": {"cached_tokens": "x"}, "completion_tokens_details": {"reasoning_tokens": 7},
    }  # fmt: skip
    assert chat_usage(chat) == {"reasoning_tokens": 7}
    responses = {"input_tokens": 12, "output_tokens": True, "input_tokens_details": None, "output_tokens_details": 5}
    assert responses_usage(responses) == {"input_tokens": 12}
    # A count not sent is unknown, not 0: a total over it must not look exact
    assert chat_usage({"prompt_tokens": None, "completion_tokens": 5}) == {"output_tokens": 5}
    assert chat_usage({"prompt_tokens": "12", "completion_tokens": [1]}) == {}
    # A usage that is no object is none reported: unknown, not a failed step
    assert chat_usage("12") == responses_usage([12]) == chat_usage(None) == {}


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        (0, 0), (12, 12), (2**31 - 1, 2**31 - 1), (12.0, 12), (0.0, 0),
        (None, None), ("12", None), ("", None), ([1], None), ({"n": 1}, None), (True, None), (False, None),
        (3.5, None), (-1, None), (-1.0, None), (2**31, None), (float("inf"), None), (float("nan"), None),
    ],
)  # fmt: skip
def test_a_token_count_is_kept_only_as_a_whole_number_a_column_holds(sent: object, stored: int | None) -> None:
    assert count(sent) == stored
    usage = reported_usage(sent, 5)
    assert usage == ({"output_tokens": 5} if stored is None else {"input_tokens": stored, "output_tokens": 5})
    assert Metrics.reported(usage, Prices(input=1, output=1)) == Metrics(
        input_tokens=stored, output_tokens=5, cost=None if stored is None else (stored + 5) / 1e6
    )


def test_what_a_provider_says_of_its_reply_reaches_a_span_escaped_and_bounded() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from orchestrator import tracing
    from orchestrator.models.base import ModelReply

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("test").start_span("chat")
    reply = ModelReply(content="ok", response_model="gpt\ud800", response_id="x" * 5000, finish_reason="stop\x00")
    tracing.Current(span).reply(reply)
    span.end()

    [done] = exporter.get_finished_spans()
    attributes = done.attributes or {}
    assert "\ud800" not in str(attributes["gen_ai.response.model"])
    assert len(str(attributes["gen_ai.response.id"])) <= 256
    assert "\x00" not in str(attributes["gen_ai.response.finish_reasons"])
