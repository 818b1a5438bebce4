"""The transcript as Gemini's Contents and Parts, and Gemini's replies read back: what a reply that
cannot be an answer (blocked, cut by max_output_tokens, a call Gemini could not make) becomes."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from google.genai import types

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message, ToolCall
from orchestrator.models.gemini_parts import UNSIGNED, GeminiReader, gemini_contents, gemini_usage, wire_reply


def reply(
    *parts: types.Part, finish: str | None = "STOP", finish_message: str | None = None, **fields: Any
) -> types.GenerateContentResponse:
    content = types.Content(role="model", parts=list(parts))
    candidate = types.Candidate(
        content=content,
        finish_reason=types.FinishReason(finish) if finish else None,
        finish_message=finish_message,
        index=0,
    )
    return types.GenerateContentResponse(candidates=[candidate], **fields)


def read(*responses: types.GenerateContentResponse) -> Any:
    reader = GeminiReader("Gemini(id='g')", 3)
    for response in responses:
        reader.feed(wire_reply(response))  # the API's JSON, as the adapter reads it
    return reader.reply()


def final_error(*responses: types.GenerateContentResponse) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        read(*responses)
    assert caught.value.retryable is False
    return caught.value


def wire(value: Any) -> Any:
    """One of the SDK's types as the API's JSON."""
    return value.model_dump(mode="json", by_alias=True, exclude_none=True)


def call(name: str, **args: Any) -> types.Part:
    return types.Part(function_call=types.FunctionCall(name=name, args=args))


def test_a_transcript_becomes_a_system_instruction_and_alternating_contents() -> None:
    calls = [ToolCall(id="call_a", name="search", arguments='{"q": "x"}'), ToolCall(id="call_b", name="fetch")]
    messages = [
        Message(role="system", content="Be brief."),
        Message(role="user", content="hi"),
        Message(role="assistant", content="Looking.", tool_calls=[c.to_openai() for c in calls]),
        # Committed in the other order, one of them failed
        Message(role="tool", tool_call_id="call_b", content="boom", tool_call_error=True),
        Message(role="tool", tool_call_id="call_a", tool_name="search", content="found"),
        Message(role="user", content="thanks"),
    ]
    system, contents = gemini_contents(messages)
    assert system == {"parts": [{"text": "Be brief."}]}
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[1]["parts"] == [
        {"text": "Looking."},
        # The first call of the turn carries the signature Gemini takes for calls it did not sign
        {"functionCall": {"name": "search", "args": {"q": "x"}}, "thoughtSignature": UNSIGNED},
        {"functionCall": {"name": "fetch", "args": {}}},
    ]
    assert base64.b64decode(UNSIGNED) == b"skip_thought_signature_validator"
    # The results go back in call order, named by the call they answer, the user's text after them
    assert contents[2]["parts"] == [
        {"functionResponse": {"name": "search", "response": {"result": "found"}}},
        {"functionResponse": {"name": "fetch", "response": {"error": "boom"}}},
        {"text": "thanks"},
    ]


def test_text_and_calls_are_read_thoughts_left_out() -> None:
    thought = types.Part(text="let me think", thought=True)
    out = read(reply(thought, types.Part(text="ok"), call("a", x=1), call("b")))
    assert out.content == "ok" and out.finish_reason == "stop"
    assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == [
        ("gemini_3_0", "a", '{"x": 1}'),
        ("gemini_3_1", "b", "{}"),
    ]


def test_an_id_gemini_gives_is_kept() -> None:
    given = types.Part(function_call=types.FunctionCall(id="fc-9", name="a", args={}))
    assert [c.id for c in read(reply(given)).tool_calls] == ["fc-9"]


def test_usage_counts_thoughts_as_reasoning_in_the_output_and_cached_in_the_input() -> None:
    usage = wire(
        types.GenerateContentResponseUsageMetadata(
            prompt_token_count=50, candidates_token_count=10, thoughts_token_count=20, cached_content_token_count=30
        )
    )
    assert gemini_usage(usage) == {"input_tokens": 50, "output_tokens": 30, "cached_tokens": 30, "reasoning_tokens": 20}
    # Gemini's JSON leaves zeros out: in a usage with counts, a missing one is 0; no usage is unknown
    sparse = wire(types.GenerateContentResponseUsageMetadata(prompt_token_count=5, candidates_token_count=2))
    assert gemini_usage(sparse) == {"input_tokens": 5, "output_tokens": 2, "cached_tokens": 0, "reasoning_tokens": 0}
    assert gemini_usage(None) == {} and gemini_usage(wire(types.GenerateContentResponseUsageMetadata())) == {}
    # Nothing validated the JSON: a count that is not one leaves its sum unknown, never 0
    assert gemini_usage({"promptTokenCount": "many", "candidatesTokenCount": 2}) == {
        "output_tokens": 2,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
    }


def test_a_stream_reads_as_the_whole_reply() -> None:
    chunks = [reply(types.Part(text="Hel"), finish=None), reply(types.Part(text="lo"), finish="STOP", response_id="r")]
    out = read(*chunks)
    assert (out.content, out.response_id) == ("Hello", "r")


def test_a_stream_that_ends_before_its_finish_reason_is_malformed() -> None:
    with pytest.raises(ValueError, match="before its finish reason"):
        read(reply(types.Part(text="Hel"), finish=None))


def test_max_tokens_mid_function_call_is_a_final_error_that_says_what_to_raise() -> None:
    error = final_error(reply(call("a"), finish="MAX_TOKENS"))
    assert error.kind == "TruncatedReply" and "mid function call" in str(error) and "max_output_tokens" in str(error)


def test_max_tokens_spent_before_any_text_is_a_final_error() -> None:
    error = final_error(reply(finish="MAX_TOKENS"))
    assert error.kind == "TruncatedReply" and "before any text" in str(error)


def test_text_cut_by_max_tokens_is_kept_as_a_truncated_answer() -> None:
    out = read(reply(types.Part(text="The answer is"), finish="MAX_TOKENS"))
    assert (out.content, out.finish_reason) == ("The answer is", "max_tokens")


@pytest.mark.parametrize("finish", ["SAFETY", "RECITATION", "PROHIBITED_CONTENT"])
def test_a_withheld_reply_is_a_final_error(finish: str) -> None:
    error = final_error(reply(types.Part(text="partial"), finish=finish))
    assert error.kind == "ReplyBlocked" and finish in str(error) and "safety_settings" in str(error)


def test_a_blocked_prompt_is_a_final_error_with_googles_reason() -> None:
    feedback = types.GenerateContentResponsePromptFeedback(
        block_reason=types.BlockedReason.SAFETY, block_reason_message="unsafe"
    )
    error = final_error(types.GenerateContentResponse(prompt_feedback=feedback))
    assert error.kind == "PromptBlocked" and "SAFETY: unsafe" in str(error)


def test_a_function_call_gemini_could_not_make_is_a_final_error() -> None:
    error = final_error(reply(finish="MALFORMED_FUNCTION_CALL", finish_message="bad args"))
    assert error.kind == "MalformedFunctionCall" and "bad args" in str(error)


def test_an_empty_reply_with_another_reason_is_a_final_error() -> None:
    assert final_error(reply(finish="OTHER")).kind == "EmptyReply"


def test_a_function_call_without_a_name_is_malformed() -> None:
    with pytest.raises(ValueError, match="without a name"):
        read(reply(types.Part(function_call=types.FunctionCall(args={}))))


def test_a_reply_stopped_at_the_request_limit_is_resumed_with_its_token_and_its_usage_summed() -> None:
    reader = GeminiReader("Gemini(id='g')", 3)
    usage = types.GenerateContentResponseUsageMetadata(prompt_token_count=10, candidates_token_count=4)
    first = reply(types.Part(text="Hel"), finish="CONTINUATION", usage_metadata=usage)
    assert first.candidates is not None
    first.candidates[0].continuation_token = b"more"
    reader.feed(wire(first))
    token = reader.continuation()
    assert token is not None and base64.b64decode(token) == b"more"
    reader.feed(wire(reply(types.Part(text="lo"), usage_metadata=usage)))
    assert reader.continuation() is None  # finished: nothing more to ask for
    out = reader.reply()
    assert (out.content, out.finish_reason) == ("Hello", "stop")
    assert (out.usage["input_tokens"], out.usage["output_tokens"]) == (20, 8)
