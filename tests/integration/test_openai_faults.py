"""The OpenAI adapters when the call goes wrong in ways an HTTP status does not say: a reply that
trickles in, a 200 that is not JSON, text no database takes, a key no header can carry, and an
exception the task runner raises inside the call. Real openai client, scripted server on 127.0.0.1.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx2
import openai
import pytest

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models._openai import OpenAIModel
from orchestrator.models.base import CallContext, ModelReply, ToolSpec
from orchestrator.models.failures import injected_cause
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.models.openai_responses import OpenAIResponses
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.servers import fresh_server

GOOD_KEY = "sk-test-good-0123456789abcdef"
SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)


class Interrupted(Exception):
    """What a task runner raises inside a call to stop it, as Celery's SoftTimeLimitExceeded does."""


@pytest.fixture
def server(scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> ScriptedServer:
    env, unset = {"OPENAI_API_KEY": GOOD_KEY}, ["OPENAI_BASE_URL"]
    return fresh_server(scripted_server, monkeypatch, ScriptConfig(), env=env, unset=unset)


@pytest.fixture(params=[OpenAIChat, OpenAIResponses], ids=lambda cls: cls.__name__)
def adapter(request: pytest.FixtureRequest) -> type[OpenAIModel]:
    return request.param  # type: ignore[no-any-return]


def ask(model: OpenAIModel, text: str = "find cats", *, timeout: float | None = None, run_id: str = "r") -> ModelReply:
    return model.invoke(
        [Message(role="user", content=text)], [SEARCH], context=CallContext(run_id=run_id, seq=1, timeout=timeout)
    )


def failure(model: OpenAIModel, **kwargs: Any) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        ask(model, **kwargs)
    return caught.value


# ---------------------------------------------------------------- a reply that trickles in


def test_a_reply_that_trickles_in_fails_as_a_retryable_timeout_within_about_the_timeout(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    model = adapter("gpt-test", base_url=server.url)
    ask(model)  # the SDK is imported and the connection is open: the timing below is the call's
    # Each byte comes sooner than the timeout; the whole body (hundreds of bytes) takes > 10 s.
    server.configure(ScriptConfig(trickle_s=0.03))

    started = time.monotonic()
    error = failure(model, timeout=1.0, run_id="slow")
    took = time.monotonic() - started

    assert 1.0 <= took < 3.0, took
    assert (error.retryable, error.kind) == (True, "APITimeoutError")
    assert "within 1s" in str(error) and "RATCHET_MODEL_TIMEOUT" in str(error)
    server.configure(ScriptConfig())
    assert ask(model, run_id="after").tool_calls, "the cut connection is not reused"


def test_a_body_that_stalls_after_a_slow_start_fails_at_the_deadline_not_a_whole_timeout_later(
    server: ScriptedServer,
) -> None:
    model = OpenAIChat("gpt-test", base_url=server.url)
    ask(model)
    # The headers come after 1.5 s of the 2 s; then one byte of the body, and nothing for 30 s.
    server.configure(ScriptConfig(delay_s=1.5, trickle_s=30))

    started = time.monotonic()
    error = failure(model, timeout=2.0, run_id="stalled")
    took = time.monotonic() - started

    # A read that could wait the whole timeout again would end at 3.5 s.
    assert 2.0 <= took < 3.0, took
    assert error.kind == "APITimeoutError"


def test_a_reply_that_arrives_whole_in_time_is_not_cut(server: ScriptedServer, adapter: type[OpenAIModel]) -> None:
    server.configure(ScriptConfig(trickle_s=0.001))
    assert ask(adapter("gpt-test", base_url=server.url), timeout=10.0).tool_calls


# ---------------------------------------------------------------- a 200 that is not a reply


@pytest.mark.parametrize("content_type", ["application/json", "text/html"])
def test_a_200_whose_body_is_not_json_is_a_retryable_malformed_reply_naming_the_model(
    server: ScriptedServer, adapter: type[OpenAIModel], content_type: str
) -> None:
    page = "<html><body>502 Bad Gateway</body></html>"
    server.configure(ScriptConfig(faults=[Fault(status=200, body=page, content_type=content_type)]))
    model = adapter("gpt-test", base_url=server.url)

    error = failure(model)

    assert (error.retryable, error.kind) == (True, "MalformedReply")
    assert str(error).startswith(model.describe() + ": malformed reply: ")
    assert ask(model).tool_calls, "the fault fires once, so the retry succeeds"


# A whole reply is read as the JSON the server sent (`orchestrator.models._json`): each API's
# body of the wrong shape, and what the error names.
WRONG_SHAPES = [
    pytest.param(OpenAIChat, "[1, 2]", "not a JSON object", id="chat-not-an-object"),
    pytest.param(OpenAIChat, '{"id": "c"}', "no choices", id="chat-no-choices"),
    pytest.param(OpenAIChat, '{"choices": [{"message": "hi"}]}', "not a JSON object", id="chat-message-text"),
    pytest.param(
        OpenAIChat, '{"choices": [{"message": {"tool_calls": [{"function": {"name": "search"}}]}}]}', "ToolCall\nid",
        id="chat-call-without-id",
    ),
    pytest.param(OpenAIResponses, "null", "not a JSON object", id="responses-null"),
    pytest.param(OpenAIResponses, '{"output": []}', "no output", id="responses-no-output"),
    pytest.param(
        OpenAIResponses, '{"output": [{"type": "message", "content": "hi"}]}', "not a JSON array",
        id="responses-content-text",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("model_class", "body", "named"), WRONG_SHAPES)
def test_a_200_whose_json_is_not_the_apis_reply_is_a_retryable_malformed_reply_saying_what(
    server: ScriptedServer, model_class: type[OpenAIModel], body: str, named: str
) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=200, body=body)]))
    model = model_class("gpt-test", base_url=server.url)

    error = failure(model)

    assert (error.retryable, error.kind) == (True, "MalformedReply")
    assert str(error).startswith(model.describe() + ": malformed reply: ") and named in str(error), error
    assert ask(model).tool_calls, "the fault fires once, so the retry succeeds"


def test_a_failed_response_is_a_retryable_error_with_the_providers_message(server: ScriptedServer) -> None:
    body = '{"status": "failed", "output": [], "error": {"code": "server_error", "message": "the model broke"}}'
    server.configure(ScriptConfig(faults=[Fault(status=200, body=body)]))
    model = OpenAIResponses("gpt-test", base_url=server.url)

    error = failure(model)

    assert (error.retryable, error.kind, str(error)) == (True, "ResponseFailed", f"{model.describe()}: the model broke")


LABELLED_AS_TEXT = {
    OpenAIChat: '{"id": "c", "model": "m", "choices": [{"index": 0, "finish_reason": "stop", "message": '
    '{"role": "assistant", "content": "from a proxy"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}',
    OpenAIResponses: '{"id": "r", "model": "m", "status": "completed", "output": [{"type": "message", "role": '
    '"assistant", "content": [{"type": "output_text", "text": "from a proxy"}]}], '
    '"usage": {"input_tokens": 3, "output_tokens": 2}}',
}


def test_a_reply_labelled_as_text_is_read_as_json_all_the_same(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    # Some proxies label a JSON reply text/plain; the client parses such a body for a typed reply,
    # so Ratchet, which asks it for the JSON instead, parses it too.
    fault = Fault(status=200, body=LABELLED_AS_TEXT[adapter], content_type="text/plain")
    server.configure(ScriptConfig(faults=[fault]))

    reply = ask(adapter("gpt-test", base_url=server.url))

    assert (reply.content, reply.usage, reply.response_model) == (
        "from a proxy",
        {"input_tokens": 3, "output_tokens": 2},
        "m",
    )


def test_a_reply_with_a_nul_or_a_lone_surrogate_reaches_the_model_reply_unchanged(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    # Sent escaped as \u0000 and \udcff, as JSON allows; storing such text is the store's concern.
    odd = "a\x00b\udcffc"
    server.configure(ScriptConfig(tool_batches=1, arguments={"query": odd}, final_text=odd))
    model = adapter("gpt-test", base_url=server.url)

    first = ask(model)
    (call,) = first.tool_calls
    assert call.arguments == '{"query": "a\\u0000b\\udcffc"}'
    transcript = [Message(role="user", content="q"), first.to_message()]
    transcript.append(Message(role="tool", tool_call_id=call.id, content="done"))
    final = model.invoke(transcript, [SEARCH], context=CallContext(run_id="r", seq=2))
    assert final.content == odd


def test_a_transcript_with_a_lone_surrogate_is_a_final_error_that_says_what_failed(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    # The SDK encodes the body as UTF-8, which has no lone surrogates; no retry can fix that.
    error = failure(adapter("gpt-test", base_url=server.url), text="a\udcffb")
    assert (error.retryable, error.kind) == (False, "UnicodeEncodeError")
    assert "surrogates not allowed" in str(error) and "\udcff" not in str(error)
    assert server.requests == []


# ---------------------------------------------------------------- a key no header can carry


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("sk-test-caf\u00e9-0123456789abcdef", "not ASCII"),
        ("sk-test-good-0123456789abcdef\n", "line break"),
        ("sk-test-good 0123456789abcdef", "whitespace"),
        ("sk-test-good-0123456789\x7fabcdef", "control character"),
    ],
    ids=["non-ascii", "newline", "space", "delete"],
)
def test_a_key_no_header_can_carry_is_a_final_error_before_any_request_that_never_quotes_it(
    server: ScriptedServer, adapter: type[OpenAIModel], monkeypatch: pytest.MonkeyPatch, key: str, problem: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)

    error = failure(adapter("gpt-test", base_url=server.url))

    assert (error.retryable, error.kind) == (False, "AuthenticationError")
    assert problem in str(error) and "OPENAI_API_KEY" in str(error) and "workers" in str(error)
    assert "0123456789" not in str(error) and "abcdef" not in str(error)
    assert server.requests == []


def test_a_bad_key_passed_to_the_model_says_so(server: ScriptedServer, adapter: type[OpenAIModel]) -> None:
    error = failure(adapter("gpt-test", api_key="sk-\u2013test-0123456789abcdef", base_url=server.url))
    assert not error.retryable and "api_key=" in str(error) and "0123456789" not in str(error)


def test_a_header_the_sdk_cannot_encode_is_a_final_error_without_the_value(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    # The SDK encodes headers outside its own try block: a UnicodeEncodeError, whose arguments
    # (what Celery's logs and task events show) hold the whole header value.
    secret = "caf\u00e9-secret-0123456789"
    error = failure(adapter("gpt-test", base_url=server.url, default_headers={"X-Api-Key": secret}))

    assert (error.retryable, error.kind) == (False, "UnicodeEncodeError")
    assert "secret-0123456789" not in repr(error) and error.__cause__ is None and error.__context__ is None
    assert server.requests == []


# ---------------------------------------------------------------- the task runner stops the call


@contextmanager
def interrupt_when(condition: Callable[[], object]) -> Iterator[None]:
    """Raise `Interrupted` in this (the main) thread once `condition` holds, from a signal handler,
    as Celery's prefork pool raises SoftTimeLimitExceeded at a step's soft time limit."""

    def handler(signum: int, frame: object) -> None:
        raise Interrupted("the step ran past its soft time limit")

    previous = signal.signal(signal.SIGUSR1, handler)
    target = threading.get_ident()

    def fire() -> None:
        wait_until(condition, timeout=10, what="the call to be in flight")
        signal.pthread_kill(target, signal.SIGUSR1)

    thread = threading.Thread(target=fire, daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(timeout=10)
        signal.signal(signal.SIGUSR1, previous)


class WrappingChat(OpenAIChat):
    """Sends as openai did before 3.14.1: any exception during the request became APIConnectionError."""

    def send(self, client: openai.OpenAI, params: dict[str, Any], options: Any) -> Any:
        try:
            return super().send(client, params, options)
        except openai.OpenAIError:
            raise
        except Exception as exc:
            raise openai.APIConnectionError(request=httpx2.Request("POST", str(self.base_url))) from exc


@pytest.mark.parametrize("adapter", [OpenAIChat, OpenAIResponses, WrappingChat], ids=lambda cls: cls.__name__)
def test_an_exception_the_runner_raises_during_the_call_propagates_and_is_not_retried(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    server.configure(ScriptConfig(delay_s=5))
    # The SDK's own retries on: a connection error would be sent again.
    model = adapter("gpt-test", base_url=server.url, max_retries=2)

    with interrupt_when(lambda: server.requests), pytest.raises(Interrupted):
        ask(model, timeout=30)

    assert len(server.requests) == 1


def test_a_connection_error_caused_by_the_network_is_not_taken_for_an_injected_one() -> None:
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    for cause in (httpx2.ConnectError("refused"), ConnectionResetError(), TimeoutError()):
        wrapped = openai.APIConnectionError(request=request)
        wrapped.__cause__ = cause
        assert injected_cause(wrapped) is None
    wrapped.__cause__ = Interrupted()
    assert injected_cause(wrapped) is wrapped.__cause__
