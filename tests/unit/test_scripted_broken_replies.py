"""Scripted replies that are not a model's answer: a raw body instead of OpenAI's shape."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models.base import CallContext
from orchestrator.testing.script import Fault, ScriptConfig, ScriptedError, ScriptState, decide
from orchestrator.testing.scripted_model import ScriptedModel


def test_a_fault_with_a_body_sends_it_as_is_with_its_content_type() -> None:
    config = ScriptConfig(faults=[Fault(status=502, body="<html>Bad gateway</html>", content_type="text/html")])
    decision = decide(config, ScriptState(), model="m", api_key="k", conversation=[], tools=[], conversation_key="c")
    assert isinstance(decision, ScriptedError)
    assert (decision.status, decision.raw, decision.content_type) == (502, "<html>Bad gateway</html>", "text/html")


def test_a_success_fault_needs_a_body() -> None:
    with pytest.raises(ValidationError, match="needs a body"):
        Fault(status=200)


@pytest.mark.parametrize(("body", "what"), [("<html>oops</html>", "not JSON"), ("{}", "not a reply")])
def test_the_in_process_model_fails_on_a_200_that_is_no_reply_as_the_adapters_do(body: str, what: str) -> None:
    model = ScriptedModel(script=ScriptConfig(faults=[Fault(status=200, body=body)]))
    with pytest.raises(ModelCallError) as caught:
        model.invoke([Message(role="user", content="hi")], [], context=CallContext(run_id="r", seq=0))
    assert (caught.value.retryable, caught.value.kind) == (True, "MalformedReply") and what in str(caught.value)
    assert model.invoke([Message(role="user", content="hi")], [], context=CallContext(run_id="r", seq=1)).content
