"""The Gemini adapter through the real google-genai client, over HTTP, against the scripted
server's Gemini API on 127.0.0.1 (no worker: one call at a time)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest

from orchestrator.errors import ConfigurationError, ModelCallError
from orchestrator.messages import Message
from orchestrator.models import Gemini, OpenAIChat
from orchestrator.models.base import CallContext, OutputFormat, ToolSpec
from orchestrator.models.fallback import fallback_class
from orchestrator.testing.gemini_wire import gemini_base_url
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.usage import Prices
from tests.servers import fresh_server

GOOD_KEY = "AIzaTest-good-0123456789abcdefghijkl"
OTHER_KEY = "AIzaTest-other-0123456789abcdefghijk"
BAD_KEY = "AIzaTest-bad-0123456789abcdefghijklm"
SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)


@pytest.fixture
def server(scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> ScriptedServer:
    """The shared server with a fresh script and log, and a good key in GOOGLE_API_KEY."""
    env, unset = {"GOOGLE_API_KEY": GOOD_KEY}, ["GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL"]
    return fresh_server(scripted_server, monkeypatch, ScriptConfig(reject_keys=[BAD_KEY]), env=env, unset=unset)


def gemini(server: ScriptedServer, **options: Any) -> Gemini:
    return Gemini(id="gemini-test", base_url=gemini_base_url(server), **options)


def conversation(text: str = "find cats") -> list[Message]:
    return [Message(role="system", content="Be brief."), Message(role="user", content=text)]


def ask(
    model: Gemini, messages: list[Message] | None = None, *, tools: list[ToolSpec] | None = None, **ctx: Any
) -> Any:
    context = CallContext(run_id=ctx.pop("run_id", "run-1"), seq=ctx.pop("seq", 1), **ctx)
    return model.invoke(messages or conversation(), [SEARCH] if tools is None else tools, context=context)


def failure(model: Gemini, **ctx: Any) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        ask(model, **ctx)
    return caught.value


def test_a_parallel_batch_then_a_final_answer_with_the_results_sent_back_in_call_order(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(calls_per_batch=2))
    model = gemini(server, api_version="v1beta")
    messages = conversation()
    first = ask(model, messages, seq=4)
    # Two function_call parts are one batch, with ids of their step and place (Gemini sends none)
    assert [(c.id, c.name, json.loads(c.arguments)) for c in first.tool_calls] == [
        ("gemini_4_0", "search", {"query": "find cats"}),
        ("gemini_4_1", "search", {"query": "find cats"}),
    ]
    assert first.content is None and first.finish_reason == "stop"
    # Results committed in the other order go back in the order of the calls they answer
    messages.append(first.to_message())
    messages += [
        Message(role="tool", tool_call_id=c.id, tool_name=c.name, content=f"result of {c.id}")
        for c in reversed(first.tool_calls)
    ]
    final = ask(model, messages, seq=5)
    assert final.content == "Summary: result of gemini_4_0; result of gemini_4_1" and final.tool_calls == []
    assert [r["turn"] for r in server.requests] == [1, 2]
    assert {r["api"] for r in server.requests} == {"gemini"}


def test_a_plain_reply_has_gemini_usage_and_its_cost(server: ScriptedServer) -> None:
    reply = ask(gemini(server), tools=[])
    assert reply.content == "Summary: no tools were called" and reply.response_model == "gemini-test"
    # The script's usage, sent as Gemini counts it (candidates without the thoughts), read back whole
    (seen,) = server.requests
    assert reply.usage == seen["usage"]
    assert reply.usage["reasoning_tokens"] > 0 and reply.usage["cached_tokens"] > 0
    metrics = reply.to_message(Prices(input=1.0, output=4.0)).metrics
    assert metrics.cost == pytest.approx((metrics.input_tokens * 1.0 + metrics.output_tokens * 4.0) / 1e6)


def test_gemini_usage_fields_are_read_as_gemini_names_them(server: ScriptedServer) -> None:
    fields = {"promptTokenCount": 100, "candidatesTokenCount": 7, "thoughtsTokenCount": 30,
              "cachedContentTokenCount": 40, "toolUsePromptTokenCount": 5}  # fmt: skip
    server.configure(ScriptConfig(usage_fields=fields))
    reply = ask(gemini(server), tools=[])
    assert reply.usage == {"input_tokens": 105, "output_tokens": 37, "cached_tokens": 40, "reasoning_tokens": 30}


def test_a_reply_stopped_at_the_request_limit_is_resumed_until_it_finishes(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(final_text="one two three four", gemini_continuations=2))
    reply = ask(gemini(server), tools=[])
    # Three requests, each the next part of the answer; the reply is whole, its usage all three's
    assert reply.content == "one two three four" and reply.finish_reason == "stop"
    assert len(server.requests) == 3
    assert reply.usage["output_tokens"] == sum(r["usage"]["output_tokens"] for r in server.requests)


def test_a_streamed_reply_hands_each_piece_of_text_over_as_it_arrives(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(final_text="one two three four"))
    deltas: list[str] = []
    reply = ask(gemini(server), tools=[], on_delta=deltas.append)
    assert deltas == ["one", " two", " three", " four"] and reply.content == "one two three four"
    (seen,) = server.requests
    assert seen["stream"] is True and reply.usage == seen["usage"]


def test_a_streamed_batch_of_calls_comes_whole(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(calls_per_batch=3))
    deltas: list[str] = []
    reply = ask(gemini(server), on_delta=deltas.append)
    assert [c.id for c in reply.tool_calls] == ["gemini_1_0", "gemini_1_1", "gemini_1_2"] and deltas == []


def test_structured_output_asks_for_json_following_the_schema(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(final_replies=['{"city": "Paris"}']))
    schema = {"title": "Place", "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    reply = ask(gemini(server), tools=[], output=OutputFormat(name="Place", schema=schema))
    assert json.loads(reply.content) == {"city": "Paris"}
    (seen,) = server.requests
    assert {"generationConfig.responseMimeType", "generationConfig.responseJsonSchema"} <= set(seen["params"])
    assert seen["output_format"] == "Place"


def test_sampling_and_thinking_arguments_are_sent_in_the_generation_config(server: ScriptedServer) -> None:
    ask(gemini(server, temperature=0.2, max_output_tokens=256, thinking_budget=128), tools=[])
    (seen,) = server.requests
    assert {
        "generationConfig.temperature",
        "generationConfig.maxOutputTokens",
        "generationConfig.thinkingConfig",
    } <= set(seen["params"])


def test_a_run_begun_on_openai_chat_continues_on_gemini_and_back(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789abcdef")
    messages = conversation()
    openai = OpenAIChat(id="gpt-test", base_url=server.url)
    first = openai.invoke(messages, [SEARCH], context=CallContext(run_id="run-x", seq=1))
    (call,) = first.tool_calls
    messages += [first.to_message(), Message(role="tool", tool_call_id=call.id, tool_name="search", content="3 cats")]
    # Gemini reads OpenAI's call and its result: the turn it answers is the second
    final = ask(gemini(server), messages, run_id="run-x", seq=2)
    assert final.content == "Summary: 3 cats"
    messages += [final.to_message(), Message(role="user", content="and dogs?")]
    # And back: the stored messages still read as Agno's fields, which OpenAI takes as they are
    server.configure(ScriptConfig(chat=True, tool_batches=0))
    again = openai.invoke(messages, [SEARCH], context=CallContext(run_id="run-x", seq=3))
    assert again.content == "Summary: 3 cats"
    assert [r["api"] for r in server.requests] == ["chat", "gemini", "chat"]
    assert server.requests[1]["turn"] == 2


def test_google_api_key_wins_over_gemini_api_key_and_either_works_alone(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = gemini(server)
    monkeypatch.setenv("GEMINI_API_KEY", OTHER_KEY)
    ask(model, tools=[])
    monkeypatch.delenv("GOOGLE_API_KEY")
    ask(model, tools=[])
    assert [r["key_last4"] for r in server.requests] == [GOOD_KEY[-4:], OTHER_KEY[-4:]]


def test_a_missing_key_is_a_final_error_naming_both_variables(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GOOGLE_API_KEY")
    error = failure(gemini(server))
    assert (error.retryable, error.kind) == (False, "AuthenticationError")
    assert "GOOGLE_API_KEY" in str(error) and "GEMINI_API_KEY" in str(error) and server.requests == []


def test_a_rejected_key_is_a_final_authentication_error_without_the_key(server: ScriptedServer) -> None:
    error = failure(gemini(server, api_key=BAD_KEY))
    assert (error.retryable, error.kind, error.status_code) == (False, "AuthenticationError", 401)
    assert "UNAUTHENTICATED" in str(error) and "GOOGLE_API_KEY" in str(error) and BAD_KEY not in str(error)


def test_resource_exhausted_is_retryable_after_the_delay_of_its_retry_info(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=429, retry_after=7)]))
    model = gemini(server)
    error = failure(model)
    assert (error.retryable, error.kind, error.status_code, error.retry_after) == (True, "RateLimitError", 429, 7.0)
    assert "RESOURCE_EXHAUSTED" in str(error)
    assert len(server.requests) == 1, "the SDK does not retry: Ratchet's retry policy does"
    assert ask(model).tool_calls, "the fault fires once per conversation, so the retry succeeds"


@pytest.mark.parametrize(("status", "retryable"), [(500, True), (503, True), (400, False), (403, False), (404, False)])
def test_each_status_is_retryable_or_final(server: ScriptedServer, status: int, retryable: bool) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=status)]))
    error = failure(gemini(server))
    assert (error.retryable, error.status_code) == (retryable, status)


def test_a_connection_failure_is_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_API_KEY", GOOD_KEY)
    with ScriptedServer() as stopped:
        url = gemini_base_url(stopped)
    error = failure(Gemini(id="gemini-test", base_url=url, timeout=2))
    assert (error.retryable, error.kind) == (True, "APIConnectionError")


def test_a_reply_that_trickles_in_fails_at_the_whole_call_deadline(server: ScriptedServer) -> None:
    model = gemini(server, timeout=0.5)
    ask(model, tools=[])  # the SDK imported and the client made: they are no part of the call's time
    server.configure(ScriptConfig(trickle_s=0.01))  # a body of some 600 bytes: 6 s at this pace
    started = time.monotonic()
    error = failure(model)
    assert (error.retryable, error.kind) == (True, "APITimeoutError")
    assert time.monotonic() - started < 3 and "0.5s" in str(error)


def test_a_stream_cut_mid_reply_or_failing_mid_reply_is_retryable(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(final_text="a b c d", faults=[Fault(status=200, break_stream_after=2)]))
    cut = failure(gemini(server), tools=[], on_delta=lambda text: None)
    assert cut.retryable and cut.kind == "APIConnectionError"
    server.configure(ScriptConfig(final_text="a b c d", faults=[Fault(status=500, break_stream_after=2)]))
    broken = failure(gemini(server), tools=[], on_delta=lambda text: None)
    assert (broken.retryable, broken.status_code) == (True, 500)


def test_a_200_whose_body_is_not_json_is_a_retryable_malformed_reply(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=200, body="<html>proxy</html>", content_type="text/html")]))
    error = failure(gemini(server))
    assert (error.retryable, error.kind) == (True, "MalformedReply")
    assert "Gemini(id='gemini-test'" in str(error)


def test_importing_ratchet_and_its_scripted_server_loads_no_google_sdk() -> None:
    code = (
        "import sys, orchestrator, orchestrator.models, orchestrator.testing.server\n"
        "from orchestrator.models import Gemini\n"
        "Gemini(id='gemini-x')\n"
        "assert 'google.genai' not in sys.modules, 'google.genai was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_without_the_sdk_a_gemini_is_a_configuration_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "google.genai", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'ratchet-agents\[gemini\]'"):
        Gemini(id="gemini-x")


def test_the_key_may_be_a_file_named_by_google_api_key_file(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.delenv("GOOGLE_API_KEY")
    (tmp_path / "key").write_text(OTHER_KEY + "\n")
    monkeypatch.setenv("GOOGLE_API_KEY_FILE", str(tmp_path / "key"))
    ask(gemini(server), tools=[])
    assert [r["key_last4"] for r in server.requests] == [OTHER_KEY[-4:]]


def test_googles_400_for_an_invalid_key_is_an_authentication_error(server: ScriptedServer) -> None:
    # Gemini refuses a bad key with 400 INVALID_ARGUMENT and the reason API_KEY_INVALID
    body = {"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
                      "status": "INVALID_ARGUMENT", "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                                                 "reason": "API_KEY_INVALID"}]}}  # fmt: skip
    server.configure(ScriptConfig(faults=[Fault(status=400, body=json.dumps(body))]))
    error = failure(gemini(server))
    assert (error.retryable, error.kind, error.status_code) == (False, "AuthenticationError", 400)
    assert "API key not valid" in str(error) and "GOOGLE_API_KEY" in str(error)


def test_googles_400_for_a_prompt_past_the_context_is_a_final_context_overflow(server: ScriptedServer) -> None:
    message = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."
    server.configure(ScriptConfig(faults=[Fault(status=400, message=message)]))
    error = failure(gemini(server))
    assert (error.retryable, error.status_code, error.context_overflow) == (False, 400, True)
    assert fallback_class(error) == "context_overflow"


def test_the_provider_and_the_span_say_gemini_and_its_server_never_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOOGLE_GEMINI_BASE_URL", raising=False)
    model = Gemini(id="gemini-2.5-flash", api_key=GOOD_KEY, temperature=0.3)
    assert model.provider == "gcp.gemini" and model.describe() == "Gemini(id='gemini-2.5-flash')"
    assert model.span_attributes() == {
        "server.address": "generativelanguage.googleapis.com",
        "server.port": 443,
        "gen_ai.request.temperature": 0.3,
    }
    assert GOOD_KEY not in repr(vars(model).get("base_url")) and GOOD_KEY not in model.describe()


def test_what_on_delta_raises_is_the_callers_and_the_next_calls_are_served(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(final_text="a b c d"))
    model = gemini(server)

    def refuse(text: str) -> None:
        raise LookupError("the reader went away")

    for _ in range(3):
        with pytest.raises(LookupError, match="went away"):
            ask(model, tools=[], on_delta=refuse)
    assert ask(model, tools=[], on_delta=lambda text: None).content == "a b c d"


def test_a_stream_that_trickles_past_the_deadline_fails_as_a_retryable_timeout(server: ScriptedServer) -> None:
    server.configure(ScriptConfig(final_text="one two three four five six seven eight", chunk_delay_s=0.2))
    model = gemini(server, timeout=0.5)
    ask(model, tools=[])  # the SDK imported and the client made: they are no part of the call's time
    deltas: list[str] = []
    started = time.monotonic()
    error = failure(model, tools=[], on_delta=deltas.append)
    assert (error.retryable, error.kind) == (True, "APITimeoutError")
    assert time.monotonic() - started < 1.2 and 0 < len(deltas) < 8
