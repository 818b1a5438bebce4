"""Tool call ids are unique in a run, whatever the provider sends."""

from __future__ import annotations

from orchestrator.engine import _unique_call_ids
from orchestrator.messages import Message, ToolCall


def test_ids_that_are_empty_repeated_or_used_before_get_a_suffix_and_fresh_ones_are_kept() -> None:
    earlier = [Message(role="assistant", tool_calls=[ToolCall(id="call_0", name="t").to_openai()])]
    reply = [
        ToolCall(id="call_0", name="t"),  # reused from an earlier turn
        ToolCall(id="", name="t"),  # empty
        ToolCall(id="fresh", name="t"),
        ToolCall(id="fresh", name="t"),  # twice in one reply
    ]
    ids = [c.id for c in _unique_call_ids(reply, earlier, seq=4)]
    assert ids[2] == "fresh"
    assert len(set(ids)) == 4 and "call_0" not in ids and "" not in ids
    assert ids[0].startswith("call_0~4.") and ids[3].startswith("fresh~4.")


def test_a_reply_with_unique_ids_is_returned_as_it_is() -> None:
    reply = [ToolCall(id="a", name="t"), ToolCall(id="b", name="t")]
    assert _unique_call_ids(reply, [], seq=0) == reply


def test_the_tool_batch_cap_counts_only_since_the_user_last_spoke() -> None:
    from orchestrator.engine import _batches_since_last_user_message

    batch = Message(role="assistant", tool_calls=[ToolCall(id="x", name="t").to_openai()])
    transcript = [Message(role="user", content="a"), batch, batch, Message(role="user", content="b"), batch]
    assert _batches_since_last_user_message(transcript) == 1
    assert _batches_since_last_user_message(transcript[:3]) == 2
