"""Transcripts: which tool calls a run still owes."""

from __future__ import annotations

from orchestrator.messages import Message, ToolCall, unanswered_calls


def assistant(*ids: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=i, name="t").to_openai() for i in ids])


def tool_result(call_id: str) -> Message:
    return Message(role="tool", tool_call_id=call_id, tool_name="t", content="ok")


def test_a_transcript_without_tool_calls_owes_nothing() -> None:
    assert unanswered_calls([Message(role="user", content="hi"), Message(role="assistant", content="yo")]) == []


def test_only_the_calls_of_the_last_assistant_message_without_results_are_owed() -> None:
    transcript = [Message(role="user", content="hi"), assistant("a", "b", "c"), tool_result("b")]
    assert [c.id for c in unanswered_calls(transcript)] == ["a", "c"]


def test_calls_answered_in_an_earlier_batch_are_not_owed_again() -> None:
    transcript = [assistant("a"), tool_result("a"), assistant("b"), tool_result("b")]
    assert unanswered_calls(transcript) == []


def test_a_message_survives_its_row_form() -> None:
    msg = Message(role="tool", content="x", tool_call_id="c", tool_name="t", tool_args={"q": 1}, tool_call_error=True)
    row = type("Row", (), {**msg.to_row(), "created_at": 1.5})()
    assert Message.from_row(row) == msg.model_copy(update={"created_at": 1.5})
