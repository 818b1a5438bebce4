"""Tool call ids are unique in a run, whatever the provider sends."""

from __future__ import annotations

from orchestrator.messages import Message, ToolCall
from orchestrator.steps.model import _unique_call_ids
from orchestrator.store.transcripts import Transcript


def test_ids_that_are_empty_repeated_or_used_before_get_a_suffix_and_fresh_ones_are_kept() -> None:
    earlier = [Message(role="assistant", tool_calls=[ToolCall(id="call_0", name="t").to_openai()])]
    reply = [
        ToolCall(id="call_0", name="t"),  # reused from an earlier turn
        ToolCall(id="", name="t"),  # empty
        ToolCall(id="fresh", name="t"),
        ToolCall(id="fresh", name="t"),  # twice in one reply
    ]
    ids = [c.id for c in _unique_call_ids(reply, Transcript.of(earlier).call_ids, seq=4)]
    assert ids[2] == "fresh"
    assert len(set(ids)) == 4 and "call_0" not in ids and "" not in ids
    assert ids[0].startswith("call_0~4.") and ids[3].startswith("fresh~4.")


def test_a_reply_with_unique_ids_is_returned_as_it_is() -> None:
    reply = [ToolCall(id="a", name="t"), ToolCall(id="b", name="t")]
    assert _unique_call_ids(reply, set(), seq=0) == reply


def test_the_tool_batch_cap_counts_only_since_the_user_last_spoke() -> None:
    batch = Message(role="assistant", tool_calls=[ToolCall(id="x", name="t").to_openai()])
    transcript = [Message(role="user", content="a"), batch, batch, Message(role="user", content="b"), batch]
    assert Transcript.of(transcript).tool_batches == 1
    assert Transcript.of(transcript[:3]).tool_batches == 2


def test_a_transcript_grown_step_by_step_knows_what_one_built_at_once_knows() -> None:
    # The cache appends each step's messages to a copy of what it knew; the facts must not drift.
    call = lambda i: ToolCall(id=f"c{i}", name="t").to_openai()  # noqa: E731
    messages = [Message(role="user", content="a")]
    for i in range(6):
        messages.append(Message(role="assistant", tool_calls=[call(i), call(i + 100)]))
        messages.append(Message(role="tool", tool_call_id=f"c{i}", tool_name="t", content="ok"))
        if i == 3:
            messages.append(Message(role="user", content="again"))
    grown = Transcript()
    for start in range(0, len(messages), 2):
        grown = grown.copy()
        grown.append(messages[start : start + 2])
    whole = Transcript.of(messages)
    assert (grown.messages, grown.call_ids, grown.tool_batches) == (whole.messages, whole.call_ids, whole.tool_batches)
    assert whole.tool_batches == 2 and len(whole.call_ids) == 12
