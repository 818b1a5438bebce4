"""Structured output without I/O: the strict schema asked for, the validation error, the correction
shown on the retry, and what a producer reads back; plus the adapters' request parameters."""

from __future__ import annotations

import uuid

import pytest
from pydantic import BaseModel

from orchestrator import Agent
from orchestrator.errors import ConfigurationError
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat, OpenAIResponses
from orchestrator.models.base import CallContext
from orchestrator.structured import INVALID_OUTPUT, content_of, correction, output_format, validate


class Answer(BaseModel):
    text: str
    confidence: float | None = None


def test_the_schema_asked_for_is_strict_and_named_after_the_class() -> None:
    fmt = output_format(Answer)

    assert fmt.name == "Answer"
    assert fmt.schema["additionalProperties"] is False
    assert sorted(fmt.schema["required"]) == ["confidence", "text"]


def test_a_valid_reply_passes_and_an_invalid_one_is_a_retryable_output_error() -> None:
    assert validate(Answer, '{"text": "hi", "confidence": 0.5}') is None

    error = validate(Answer, '{"confidence": "high"}')

    assert error is not None and error.retryable and error.kind == INVALID_OUTPUT
    assert "text" in str(error) and "confidence" in str(error)
    assert validate(Answer, None) is not None


def test_only_a_retry_of_an_invalid_output_gets_a_correction_for_the_model() -> None:
    error = validate(Answer, "not json")
    assert error is not None

    message = correction(error.to_record())

    assert message is not None and message.role == "user" and str(error) in (message.content or "")
    assert correction({"type": "RateLimitError", "message": "slow down"}) is None
    assert correction(None) is None


def test_a_producer_gets_the_instance_for_a_registered_agent_and_the_text_otherwise() -> None:
    agent = Agent(name=f"answers-{uuid.uuid4().hex[:6]}", model=OpenAIChat(), output_schema=Answer)

    assert content_of(agent.name, '{"text": "hi", "confidence": null}') == Answer(text="hi")
    assert content_of(agent.name, '{"schema": "changed"}') == '{"schema": "changed"}'
    assert content_of("not-registered-here", '{"text": "hi"}') == '{"text": "hi"}'
    assert content_of(agent.name, None) is None


def test_an_output_schema_must_be_a_pydantic_model_class() -> None:
    with pytest.raises(ConfigurationError, match="output_schema must be a pydantic model class"):
        Agent(name=f"bad-{uuid.uuid4().hex[:6]}", model=OpenAIChat(), output_schema=dict)  # type: ignore[arg-type]


def test_each_api_is_asked_for_the_schema_its_own_way() -> None:
    messages = [Message(role="user", content="hi")]
    context = CallContext(run_id="r", seq=0, output=output_format(Answer))

    chat, _ = OpenAIChat().request(messages, [], context)
    responses, _ = OpenAIResponses(request_params={"text": {"verbosity": "low"}}).request(messages, [], context)

    assert chat["response_format"]["type"] == "json_schema"
    assert chat["response_format"]["json_schema"] == {
        "name": "Answer",
        "schema": output_format(Answer).schema,
        "strict": True,
    }
    assert responses["text"]["verbosity"] == "low"
    assert responses["text"]["format"] == {
        "type": "json_schema", "name": "Answer", "schema": output_format(Answer).schema, "strict": True,
    }  # fmt: skip
    plain, _ = OpenAIChat().request(messages, [], CallContext(run_id="r", seq=0))
    assert "response_format" not in plain
