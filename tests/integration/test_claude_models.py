"""Claude through the real anthropic client, against the scripted server's Messages API on
127.0.0.1: replies, parallel calls, streaming, structured output, usage, and failures sorted
into Ratchet's classes, and a run begun on OpenAIChat continued on Claude (steps inline, no worker:
the seed's scenarios on a worker are in test_seed_scenarios.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from anthropic.types import Message as WireMessage
from anthropic.types import TextBlock, ToolUseBlock, Usage

from orchestrator import Agent, RunStatus
from orchestrator.catalog import describe
from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models import Claude, OpenAIChat
from orchestrator.models.base import CallContext, Model, OutputFormat, ToolSpec
from orchestrator.models.fallback import fallback_class
from orchestrator.testing import in_memory
from orchestrator.testing.anthropic_wire import anthropic_base_url
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.usage import Prices
from tests.deploy_support import retired
from tests.servers import fresh_server

GOOD_KEY = "sk-ant-test-good-0123456789abcdef"
BAD_KEY = "sk-ant-test-bad-0123456789abcdef"
SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
PROMPT = [Message(role="system", content="Be brief."), Message(role="user", content="find cats")]


@pytest.fixture
def server(scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> ScriptedServer:
    """The shared server, reset, with the key and base URL of Claude in the environment."""
    env = {"ANTHROPIC_API_KEY": GOOD_KEY, "ANTHROPIC_BASE_URL": anthropic_base_url(scripted_server.url)}
    return fresh_server(scripted_server, monkeypatch, ScriptConfig(reject_keys=[BAD_KEY]), env=env)


def script(server: ScriptedServer, **fields: Any) -> None:
    server.configure(ScriptConfig(reject_keys=[BAD_KEY], **fields))


def ctx(run_id: str = "run-1", **fields: Any) -> CallContext:
    return CallContext(run_id=run_id, seq=1, **fields)


def failure(model: Claude, **context: Any) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        model.invoke(PROMPT, [SEARCH], context=ctx(**context))
    return caught.value


def test_parallel_calls_then_a_final_answer_that_read_every_result(server: ScriptedServer) -> None:
    script(server, calls_per_batch=2)
    model = Claude(id="claude-x", prices=Prices(input=3, output=15))

    first = model.invoke(PROMPT, [SEARCH], context=ctx())
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [("search", {"query": "find cats"})] * 2
    assert first.finish_reason == "tool_use" and first.content is None
    results = [
        Message(role="tool", tool_call_id=c.id, tool_name=c.name, content=f"r{i}")
        for i, c in enumerate(first.tool_calls)
    ]
    final = model.invoke([*PROMPT, first.to_message(), *results], [SEARCH], context=ctx())

    assert final.content == "Summary: r0; r1" and final.finish_reason == "end_turn"
    # The script's usage, as the wire split it (cache reads apart) and the adapter added it back.
    sent = server.requests[-1]
    assert final.usage == {
        "input_tokens": sent["usage"]["input_tokens"],
        "output_tokens": sent["usage"]["output_tokens"],
        "cached_tokens": sent["usage"]["cached_tokens"],
    }
    metrics = final.to_message(model.prices).metrics
    assert metrics is not None and metrics.cost == pytest.approx(
        (final.usage["input_tokens"] * 3 + final.usage["output_tokens"] * 15) / 1_000_000
    )
    assert sent["api"] == "messages" and sent["params"] == ["max_tokens", "model", "system", "tools"]
    assert sent["key_last4"] == GOOD_KEY[-4:]


def test_cache_writes_and_reads_reported_by_the_api_land_in_the_usage(server: ScriptedServer) -> None:
    fields = {"input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 30}
    script(server, usage_fields=fields)
    for context in (ctx(), ctx("run-2", on_delta=lambda _: None)):
        reply = Claude(id="claude-x").invoke(PROMPT, [], context=context)
        assert {k: reply.usage[k] for k in ("input_tokens", "cached_tokens", "cache_write_tokens")} == {
            "input_tokens": 140,
            "cached_tokens": 100,
            "cache_write_tokens": 30,
        }
    # Stored on the reply and costed at the cache's own rates (issue 26): 10 fresh, 100 read, 30 written.
    prices = Prices(input=3, output=15, cache_read=0.3, cache_write=3.75)
    with in_memory():
        out = Agent(name="claude-cache-usage", model=Claude(id="claude-x", prices=prices)).run("hi")
    metrics = out.messages[-1].metrics
    assert out.status == RunStatus.COMPLETED and metrics is not None
    assert (metrics.input_tokens, metrics.cache_read_tokens, metrics.cache_write_tokens) == (140, 100, 30)
    assert metrics.cost == pytest.approx((10 * 3 + 100 * 0.3 + 30 * 3.75 + metrics.output_tokens * 15) / 1e6)
    assert out.metrics.cache_write_tokens == 30


def test_a_streamed_reply_hands_out_its_text_and_reads_as_the_whole_one(server: ScriptedServer) -> None:
    script(server, final_text="Cats are small furry animals.")
    deltas: list[str] = []
    model = Claude(id="claude-x")

    streamed = model.invoke(PROMPT, [], context=ctx(on_delta=deltas.append))
    whole = model.invoke(PROMPT, [], context=ctx("run-2"))

    assert "".join(deltas) == streamed.content == whole.content == "Cats are small furry animals."
    assert len(deltas) == 5
    assert streamed == whole  # the same value, ids aside
    assert [r["stream"] for r in server.requests] == [True, False]


def test_streamed_parallel_calls_keep_their_order_and_arguments(server: ScriptedServer) -> None:
    script(server, batches=[[{"tool": "search", "arguments": {"query": "a" * 20}}, {"tool": "search"}]])
    reply = Claude(id="claude-x").invoke(PROMPT, [SEARCH], context=ctx(on_delta=lambda _: None))
    assert [json.loads(c.arguments) for c in reply.tool_calls] == [{"query": "a" * 20}, {"query": "find cats"}]


def test_structured_output_asks_for_the_json_schema_in_output_config(server: ScriptedServer) -> None:
    script(server, final_replies=['{"name": "Tom"}'])
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "additionalProperties": False,
    }
    reply = Claude(id="claude-x").invoke(PROMPT, [], context=ctx(output=OutputFormat(name="Cat", schema=schema)))
    assert json.loads(reply.content or "") == {"name": "Tom"}
    assert server.requests[-1]["output_format"] == "json_schema"
    assert "output_config" in server.requests[-1]["params"]


@pytest.mark.parametrize(
    ("status", "kind", "retry_after"),
    [
        (529, "OverloadedError", None),
        (429, "RateLimitError", 7.0),
        (500, "InternalServerError", None),
        (503, "ServiceUnavailableError", None),
    ],
)
def test_overloaded_rate_limited_and_server_errors_are_retryable(
    server: ScriptedServer, status: int, kind: str, retry_after: float | None
) -> None:
    script(server, faults=[Fault(status=status, retry_after=retry_after, message="try later")])
    error = failure(Claude(id="claude-x"))
    assert (error.retryable, error.status_code, error.kind, error.retry_after) == (True, status, kind, retry_after)
    assert "try later" in str(error)


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "BadRequestError"), (401, "AuthenticationError"), (403, "PermissionDeniedError"), (404, "NotFoundError")],
)
def test_client_errors_are_final(server: ScriptedServer, status: int, kind: str) -> None:
    script(server, faults=[Fault(status=status, message="no")])
    error = failure(Claude(id="claude-x"))
    assert (error.retryable, error.status_code, error.kind) == (False, status, kind)


def test_a_rejected_key_is_a_final_401_whose_text_never_holds_the_key(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", BAD_KEY)
    error = failure(Claude(id="claude-x"))
    assert (error.retryable, error.status_code, error.kind) == (False, 401, "AuthenticationError")
    assert "ANTHROPIC_API_KEY" in str(error) and BAD_KEY not in str(error) and BAD_KEY[-10:] not in str(error)


def test_no_key_is_a_final_error_saying_which_variable_before_any_request(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    error = failure(Claude(id="claude-x"))
    assert error.retryable is False and "set ANTHROPIC_API_KEY" in str(error)
    assert server.requests == []


@pytest.mark.parametrize(
    "message",
    [
        "prompt is too long: 210000 tokens > 200000 maximum",
        "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000, decrease input length",
    ],
)
def test_a_prompt_too_long_for_the_model_is_a_final_context_overflow(server: ScriptedServer, message: str) -> None:
    script(server, faults=[Fault(status=400, message=message)])
    error = failure(Claude(id="claude-x"))
    assert (error.retryable, error.status_code, error.context_overflow) == (False, 400, True)
    assert fallback_class(error) == "context_overflow"


def test_an_error_mid_stream_and_a_stream_cut_short_are_retryable(server: ScriptedServer) -> None:
    script(server, final_text="one two three four", faults=[Fault(status=500, break_stream_after=3, message="Boom")])
    error = failure(Claude(id="claude-x"), on_delta=lambda _: None)
    assert (error.retryable, error.kind) == (True, "StreamError") and "Boom" in str(error)
    assert fallback_class(error) == "error"
    # Overloaded or rate limited mid-stream: a rate limit, as the same error before the stream.
    script(
        server, final_text="one two three four", faults=[Fault(status=529, break_stream_after=3, message="Overloaded")]
    )
    error = failure(Claude(id="claude-x"), on_delta=lambda _: None)
    assert (error.retryable, error.kind) == (True, "OverloadedError") and "Overloaded" in str(error)
    assert fallback_class(error) == "rate_limit"
    script(server, final_text="one two three four", faults=[Fault(status=200, break_stream_after=3)])
    assert failure(Claude(id="claude-x"), on_delta=lambda _: None).retryable is True


def test_no_server_and_a_reply_past_the_timeout_are_retryable() -> None:
    unreachable = Claude(id="claude-x", api_key=GOOD_KEY, base_url="http://127.0.0.1:9")
    error = failure(unreachable)
    assert (error.retryable, error.kind) == (True, "APIConnectionError")


def test_a_reply_that_trickles_in_past_the_timeout_is_a_retryable_timeout(server: ScriptedServer) -> None:
    script(server, trickle_s=0.02)
    error = failure(Claude(id="claude-x", timeout=0.3))
    assert (error.retryable, error.kind) == (True, "APITimeoutError") and "within 0.3s" in str(error)


def wire_reply(stop: str) -> str:
    call = ToolUseBlock(type="tool_use", id="t1", name="search", input={"query": "ca"})
    message = WireMessage(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-x",
        content=[TextBlock(type="text", text="Searching"), call],
        stop_reason=stop,  # type: ignore[arg-type]
        stop_sequence=None,
        usage=Usage(input_tokens=5, output_tokens=64),
    )
    return message.model_dump_json()


def test_a_reply_stopped_on_max_tokens_mid_tool_call_is_a_clear_final_error(server: ScriptedServer) -> None:
    script(server, faults=[Fault(status=200, body=wire_reply("max_tokens"))])
    error = failure(Claude(id="claude-x", max_tokens=64))
    assert (error.retryable, error.kind) == (False, "TruncatedReply")
    assert "stopped on max_tokens in the middle of a tool call" in str(error) and "max_tokens=64" in str(error)


def test_a_reply_that_is_not_a_message_is_a_malformed_reply(server: ScriptedServer) -> None:
    script(server, faults=[Fault(status=200, body='{"type": "message", "content": "not blocks"}')])
    error = failure(Claude(id="claude-x"))
    assert error.kind == "MalformedReply" and "content" in str(error)


def test_a_stream_past_the_calls_deadline_is_a_retryable_timeout(server: ScriptedServer) -> None:
    script(server, final_text=" ".join(["word"] * 20), chunk_delay_s=0.05)
    error = failure(Claude(id="claude-x", timeout=0.3), on_delta=lambda _: None)
    assert (error.retryable, error.kind) == (True, "APITimeoutError") and "within 0.3s" in str(error)


def test_the_key_may_come_from_the_file_anthropic_api_key_file_names(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    (tmp_path / "key").write_text(GOOD_KEY + "\n")
    monkeypatch.setenv("ANTHROPIC_API_KEY_FILE", str(tmp_path / "key"))
    assert Claude(id="claude-x").invoke(PROMPT, [], context=ctx()).content
    assert server.requests[-1]["key_last4"] == GOOD_KEY[-4:]


def test_request_params_are_body_parameters_and_extra_body_is_merged_into_the_body(server: ScriptedServer) -> None:
    params = {"metadata": {"user_id": "u-1"}, "extra_body": {"service_tier": "auto"}, "extra_headers": {"X-A": "1"}}
    Claude(id="claude-x", temperature=0.2, request_params=params).invoke(PROMPT, [], context=ctx())
    assert server.requests[-1]["params"] == ["max_tokens", "metadata", "model", "service_tier", "system", "temperature"]


def lookup(query: str) -> str:
    """Look a query up."""
    return f"found {query}"


def rates_agent(model: Model) -> Agent:
    # One line defines it: built again with another model, it replaces itself, as a deploy would.
    return Agent(name="claude-continues-openai", model=model, tools=[lookup], instructions="Look it up.")


def test_a_run_begun_on_openai_chat_is_continued_on_claude_after_a_deploy_switched_the_model(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a run whose tool batch ran on OpenAIChat and whose next call failed (a final 401)
    monkeypatch.setenv("OPENAI_API_KEY", GOOD_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    script(server, faults=[Fault(turn=2, status=401, times=None)])
    with in_memory() as dispatcher:
        agent = rates_agent(OpenAIChat(id="gpt-x"))
        failed = dispatcher.client.start(agent.name, input="cats").wait(timeout=0)
        assert failed.status == RunStatus.ERROR
        assert [m.role for m in failed.messages] == ["system", "user", "assistant", "tool"]

        # When the agent now runs on Claude (the workers of the OpenAI version gone) and the run is continued
        retired(dispatcher.store, describe(agent).hash)
        rates_agent(Claude(id="claude-x"))
        script(server)
        resumed = dispatcher.client.continue_run(failed.run_id).wait(timeout=0)

    # Then Claude read OpenAI's call and its result, and the stored messages are as they were
    assert resumed.status == RunStatus.COMPLETED, resumed.error
    assert resumed.messages[:4] == failed.messages
    assert resumed.messages[4].content == "Summary: found cats"
    assert [r["api"] for r in server.requests] == ["chat", "chat", "messages"]
