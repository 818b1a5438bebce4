"""Structured output without I/O: the strict schema asked for, the validation error, the correction
shown on the retry, and what a producer reads back; plus the adapters' request parameters."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from pydantic import BaseModel, ValidationError

from orchestrator import Agent, RunOutput, RunStatus, Team
from orchestrator.errors import ConfigurationError
from orchestrator.messages import Message
from orchestrator.models import OpenAIChat, OpenAIResponses
from orchestrator.models.base import CallContext
from orchestrator.producer import as_defined
from orchestrator.structured import INVALID_OUTPUT, correction, output_format, parsed, validate
from orchestrator.testing import InMemoryDispatcher
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel


class Answer(BaseModel):
    text: str
    confidence: float | None = None


def stored_output(content: str | None, agent_name: str = "answers") -> RunOutput:
    """A completed run as the store gives it back: its content the stored text."""
    return RunOutput(
        run_id=f"run-{uuid.uuid4().hex[:8]}",
        session_id="s",
        agent_name=agent_name,
        status=RunStatus.COMPLETED,
        content=content,
        messages=[],
    )


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


def test_the_stored_text_is_parsed_with_the_schema_given_and_kept_when_it_no_longer_validates() -> None:
    assert parsed(Answer, '{"text": "hi", "confidence": null}') == Answer(text="hi")
    assert parsed(Answer, '{"schema": "changed"}') == '{"schema": "changed"}'
    assert parsed(Answer, None) is None


def test_a_run_read_back_is_the_stored_text_and_content_as_gives_the_schemas_instance() -> None:
    out = stored_output('{"text": "hi"}')

    assert out.content == '{"text": "hi"}'
    assert out.content_as(Answer) == Answer(text="hi")
    assert stored_output(None).content_as(Answer) is None
    with pytest.raises(ValidationError):
        stored_output('{"schema": "changed"}').content_as(Answer)


def test_the_agent_reads_its_own_runs_and_its_members_as_their_schemas_and_others_as_stored() -> None:
    t = uuid.uuid4().hex[:6]
    member = Agent(name=f"member-{t}", model=OpenAIChat(), output_schema=Answer)
    plain = Agent(name=f"plain-{t}", model=OpenAIChat())
    team = Team(name=f"team-{t}", model=OpenAIChat(), members=[member, plain], output_schema=Answer)
    runs = [stored_output('{"text": "a"}', member.name), stored_output('{"text": "b"}', plain.name)]
    out = replace(stored_output('{"text": "t"}', team.name), member_runs=runs)

    read = as_defined(team, out)

    assert read.content == Answer(text="t")
    assert [m.content for m in read.member_runs] == [Answer(text="a"), '{"text": "b"}']
    assert as_defined(plain, out) is out  # an agent without a schema reads every run as stored
    assert out.content == '{"text": "t"}'  # the stored output is left as it was


def test_an_agents_run_gives_its_schemas_instance_and_a_client_the_same_run_as_stored(
    inline: InMemoryDispatcher,
) -> None:
    reply = '{"text": "hi", "confidence": 0.5}'
    model = ScriptedModel(script=ScriptConfig(final_text=reply))
    agent = Agent(name=f"answers-{uuid.uuid4().hex[:6]}", model=model, output_schema=Answer)

    out = agent.run("hi", timeout=5)
    handle = agent.start("again")

    assert out.content == Answer(text="hi", confidence=0.5)
    assert handle.wait(5).content == Answer(text="hi", confidence=0.5)
    assert inline.client.get_run(out.run_id).content == reply  # the agent is registered here too
    assert inline.client.wait(handle.run_id).content_as(Answer) == Answer(text="hi", confidence=0.5)


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
        "type": "json_schema",
        "name": "Answer",
        "schema": output_format(Answer).schema,
        "strict": True,
    }
    plain, _ = OpenAIChat().request(messages, [], CallContext(run_id="r", seq=0))
    assert "response_format" not in plain
