"""Claude's side of the transcript: Agno's fields as the Messages API's blocks and back, its
usage as Ratchet counts it, and a streamed reply read event by event (no server: the HTTP side
is tests/integration/test_claude_models.py)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from orchestrator.errors import ConfigurationError, ModelCallError
from orchestrator.messages import Message, ToolCall
from orchestrator.models import Claude
from orchestrator.models._claude_blocks import (
    MessagesStreamReader,
    claude_usage,
    messages_param,
    read_message,
    system_param,
)
from orchestrator.usage import Metrics, Prices


def call(cid: str, arguments: str = '{"query": "cats"}') -> dict[str, Any]:
    return ToolCall(id=cid, name="search", arguments=arguments).to_openai()


def test_system_messages_go_apart_and_a_batchs_results_are_one_user_turn_with_the_next_user_text() -> None:
    transcript = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="find cats"),
        Message(role="assistant", content="Looking.", tool_calls=[call("c1"), call("c2", "not json")]),
        Message(role="tool", tool_call_id="c1", content="3 cats", tool_name="search"),
        Message(role="tool", tool_call_id="c2", content="boom", tool_name="search", tool_call_error=True),
        Message(role="user", content="and dogs?"),
    ]

    assert system_param(transcript, cache=False) == "Be brief."
    assert system_param(transcript, cache=True) == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    assert messages_param(transcript) == [
        {"role": "user", "content": [{"type": "text", "text": "find cats"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "c1", "name": "search", "input": {"query": "cats"}},
                # Arguments that are no JSON object are kept as sent: the API takes only an object.
                {"type": "tool_use", "id": "c2", "name": "search", "input": {"_raw": "not json"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "3 cats"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "boom", "is_error": True},
                {"type": "text", "text": "and dogs?"},
            ],
        },
    ]


def test_a_reply_of_calls_alone_sends_no_empty_text_block() -> None:
    turns = messages_param([Message(role="user", content="hi"), Message(role="assistant", tool_calls=[call("c1")])])
    assert [b["type"] for b in turns[1]["content"]] == ["tool_use"]


def test_usage_counts_cache_reads_and_writes_in_the_input_as_openai_counts_cached_tokens() -> None:
    usage = claude_usage(
        {"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 30}
    )
    assert usage == {"input_tokens": 140, "output_tokens": 4, "cached_tokens": 100, "cache_write_tokens": 30}
    metrics = Metrics.reported(usage, Prices(input=3, output=15))
    assert metrics is not None and (metrics.cache_read_tokens, metrics.cache_write_tokens) == (100, 30)
    # Without the cache's rates every input token is at the input rate; with them, each at its own.
    assert metrics.cost == pytest.approx((140 * 3 + 4 * 15) / 1_000_000)
    cached = Metrics.reported(usage, Prices(input=3, output=15, cache_read=0.3, cache_write=3.75))
    assert cached is not None and cached.cost == pytest.approx((10 * 3 + 100 * 0.3 + 30 * 3.75 + 4 * 15) / 1_000_000)
    # OpenAI's and Gemini's usage has no writes: their cached tokens at the read rate.
    openai = Metrics.reported(
        {"input_tokens": 140, "output_tokens": 4, "cached_tokens": 100}, Prices(input=3, output=15, cache_read=0.3)
    )
    assert openai is not None and openai.cache_write_tokens is None
    assert openai.cost == pytest.approx((40 * 3 + 100 * 0.3 + 4 * 15) / 1_000_000)


def test_usage_without_cache_fields_has_no_cached_count_and_a_bad_count_is_unknown() -> None:
    assert claude_usage({"input_tokens": 10, "output_tokens": 4}) == {"input_tokens": 10, "output_tokens": 4}
    # A cache count that is no whole number makes the input unknown, never a smaller exact number.
    assert claude_usage({"input_tokens": 10, "output_tokens": 4, "cache_read_input_tokens": "5"}) == {
        "output_tokens": 4
    }
    assert claude_usage(None) == {}


def events(stop: str, *, partial: str = '{"query": "ca') -> list[dict[str, Any]]:
    usage = {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": 2}
    return [
        {"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": usage}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me look."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "ping"},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "s"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": partial}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    ]


def test_a_streamed_reply_is_assembled_from_its_events() -> None:
    reader = MessagesStreamReader(Claude(id="claude-x"))
    deltas = [d for e in events("tool_use", partial='{"query": "cats"}') if (d := reader.feed(e))]
    reply = reader.reply()
    assert deltas == ["Let me look."] and reply.content == "Let me look."
    assert reply.tool_calls == [ToolCall(id="t1", name="s", arguments='{"query": "cats"}')]
    assert reply.usage == {"input_tokens": 7, "output_tokens": 9, "cached_tokens": 2}
    assert (reply.finish_reason, reply.response_id) == ("tool_use", "msg_1")


def test_a_stream_stopped_on_max_tokens_mid_tool_call_is_a_final_error_saying_what_to_raise() -> None:
    reader = MessagesStreamReader(Claude(id="claude-x", max_tokens=64))
    for event in events("max_tokens"):
        reader.feed(event)
    with pytest.raises(ModelCallError) as caught:
        reader.reply()
    assert caught.value.retryable is False and caught.value.kind == "TruncatedReply"
    assert "max_tokens=64" in str(caught.value) and "larger max_tokens=" in str(caught.value)


@pytest.mark.parametrize(
    ("stop", "kind", "says"),
    [("refusal", "ReplyBlocked", "change the input"), ("max_tokens", "TruncatedReply", "larger max_tokens=")],
)
def test_a_refusal_or_a_reply_cut_before_any_text_is_a_final_error_not_an_empty_answer(
    stop: str, kind: str, says: str
) -> None:
    model = Claude(id="claude-x", max_tokens=16)
    whole = {"id": "msg_1", "model": "claude-x", "content": [], "stop_reason": stop, "usage": {"input_tokens": 5}}
    streamed = [
        {"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 5}}},
        {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 16}},
        {"type": "message_stop"},
    ]
    reader = MessagesStreamReader(model)
    for event in streamed:
        reader.feed(event)
    for read in (lambda: read_message(model, whole), reader.reply):
        with pytest.raises(ModelCallError) as caught:
            read()
        assert (caught.value.retryable, caught.value.kind) == (False, kind) and says in str(caught.value)
    # Text cut short on max_tokens is still an answer, as Gemini's adapter keeps it.
    text = {**whole, "content": [{"type": "text", "text": "Cats are"}], "stop_reason": "max_tokens"}
    assert read_message(model, text).content == "Cats are"


def test_a_stream_that_ends_before_message_stop_is_not_a_reply() -> None:
    reader = MessagesStreamReader(Claude(id="claude-x"))
    for event in events("end_turn")[:-2]:
        reader.feed(event)
    with pytest.raises(ValueError, match="message_stop"):
        reader.reply()


def test_claude_without_the_sdk_is_a_configuration_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(ConfigurationError, match=r"ratchet-agents\[anthropic\]"):
        Claude(id="claude-x")


def test_describe_and_span_attributes_hold_no_key_and_name_the_provider() -> None:
    model = Claude(id="claude-x", api_key="sk-ant-secret-0123456789", base_url="https://u:p@proxy:8443/a?k=1", top_k=5)
    assert model.provider == "anthropic"
    assert model.describe() == "Claude(id='claude-x', base_url='https://proxy:8443/a')"
    assert model.span_attributes() == {
        "server.address": "proxy",
        "server.port": 8443,
        "gen_ai.request.max_tokens": 8192,
        "gen_ai.request.top_k": 5,
    }
