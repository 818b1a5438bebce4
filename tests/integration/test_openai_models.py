"""Both OpenAI adapters, through the real openai client, against the scripted server on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ModelCallError
from orchestrator.messages import Message
from orchestrator.models._openai import OpenAIModel
from orchestrator.models.base import CallContext, ToolSpec
from orchestrator.models.failures import parse_retry_after
from orchestrator.models.openai_chat import OpenAIChat
from orchestrator.models.openai_responses import OpenAIResponses
from orchestrator.testing.script import Fault, ScriptConfig
from orchestrator.testing.server import ScriptedServer
from orchestrator.testing.waiting import wait_until
from tests.servers import fresh_server

GOOD_KEY = "sk-test-good-0123456789abcdef"
BAD_KEY = "sk-test-bad-0123456789abcdef"
SEARCH = ToolSpec(
    name="search",
    description="Search the web.",
    parameters={"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
)
ADAPTERS = [OpenAIChat, OpenAIResponses]


@pytest.fixture
def server(scripted_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch) -> ScriptedServer:
    """The shared server with a fresh script, log and fault budgets, and a good key in the environment."""
    env, unset = {"OPENAI_API_KEY": GOOD_KEY}, ["OPENAI_BASE_URL"]
    return fresh_server(scripted_server, monkeypatch, ScriptConfig(reject_keys=[BAD_KEY]), env=env, unset=unset)


@pytest.fixture(params=ADAPTERS, ids=lambda cls: cls.__name__)
def adapter(request: pytest.FixtureRequest) -> type[OpenAIModel]:
    return request.param  # type: ignore[no-any-return]


def ctx(step: int = 1, run_id: str = "run-1") -> CallContext:
    return CallContext(run_id=run_id, seq=step)


def ask(model: OpenAIModel, text: str = "find cats", **context: Any) -> Any:
    return model.invoke(
        [Message(role="system", content="Be brief."), Message(role="user", content=text)],
        [SEARCH],
        context=ctx(**context),
    )


def failure(model: OpenAIModel) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        ask(model)
    return caught.value


def test_a_tool_call_turn_is_followed_by_a_final_answer(server: ScriptedServer, adapter: type[OpenAIModel]) -> None:
    model = adapter("gpt-test", base_url=server.url)
    messages = [Message(role="system", content="Be brief."), Message(role="user", content="find cats")]
    first = model.invoke(messages, [SEARCH], context=ctx(1))
    assert first.content is None
    assert [(c.name, json.loads(c.arguments)) for c in first.tool_calls] == [("search", {"query": "find cats"})]
    assert first.usage["input_tokens"] > 0 and first.usage["output_tokens"] > 0
    messages += [first.to_message(), Message(role="tool", tool_call_id=first.tool_calls[0].id, content="3 cats")]
    final = model.invoke(messages, [SEARCH], context=ctx(2))
    assert final.content == "Summary: 3 cats" and final.tool_calls == []
    assert [r["turn"] for r in server.requests] == [1, 2]


def test_a_rejected_key_is_a_final_authentication_error_without_the_key(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    error = failure(adapter("gpt-test", api_key=BAD_KEY, base_url=server.url))
    assert (error.retryable, error.kind, error.status_code) == (False, "AuthenticationError", 401)
    assert "OPENAI_API_KEY" in str(error) and BAD_KEY not in str(error)


def test_a_key_echoed_by_the_provider_is_redacted(server: ScriptedServer, adapter: type[OpenAIModel]) -> None:
    echoed = f"Incorrect API key provided: {GOOD_KEY[:8]}****{GOOD_KEY[-4:]}"
    server.configure(ScriptConfig(faults=[Fault(status=401, message=echoed)]))
    error = failure(adapter("gpt-test", base_url=server.url))
    # The configured key's masked echo goes whole, its ends with it
    assert str(error).endswith("Incorrect API key provided: ***")
    assert GOOD_KEY[:8] not in str(error) and GOOD_KEY[-4:] not in str(error)


def test_a_missing_key_is_a_final_error_that_says_to_set_it_on_the_workers(
    server: ScriptedServer, adapter: type[OpenAIModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    error = failure(adapter("gpt-test", base_url=server.url))
    assert (error.retryable, error.kind) == (False, "AuthenticationError")
    assert "OPENAI_API_KEY" in str(error) and "workers" in str(error)
    assert server.requests == []


def test_a_rate_limit_is_retryable_and_carries_retry_after(server: ScriptedServer, adapter: type[OpenAIModel]) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=429, retry_after=7)]))
    model = adapter("gpt-test", base_url=server.url)
    error = failure(model)
    assert (error.retryable, error.kind, error.status_code, error.retry_after) == (True, "RateLimitError", 429, 7.0)
    assert ask(model).tool_calls, "the fault fires once per conversation, so the retry succeeds"


def test_a_server_error_is_retryable(server: ScriptedServer, adapter: type[OpenAIModel]) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=500)]))
    error = failure(adapter("gpt-test", base_url=server.url))
    assert (error.retryable, error.kind, error.status_code, error.retry_after) == (
        True,
        "InternalServerError",
        500,
        None,
    )


def test_a_bad_request_is_final(server: ScriptedServer, adapter: type[OpenAIModel]) -> None:
    server.configure(ScriptConfig(faults=[Fault(status=400, message="This model's maximum context length is 8192")]))
    error = failure(adapter("gpt-test", base_url=server.url))
    assert (error.retryable, error.kind) == (False, "BadRequestError")


def test_a_connection_failure_is_retryable(adapter: type[OpenAIModel], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", GOOD_KEY)
    with ScriptedServer() as stopped:
        url = stopped.url
    error = failure(adapter("gpt-test", base_url=url, timeout=2))
    assert (error.retryable, error.kind) == (True, "APIConnectionError")


def test_malformed_arguments_are_passed_through_raw(server: ScriptedServer, adapter: type[OpenAIModel]) -> None:
    server.configure(ScriptConfig(malformed_arguments_on_turn=1))
    reply = ask(adapter("gpt-test", base_url=server.url))
    with pytest.raises(json.JSONDecodeError):
        json.loads(reply.tool_calls[0].arguments)


def test_the_base_url_comes_from_OPENAI_BASE_URL(
    server: ScriptedServer, adapter: type[OpenAIModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = adapter("gpt-test")
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    assert ask(model).tool_calls and len(server.requests) == 1


def test_the_key_is_read_at_call_time(
    server: ScriptedServer, adapter: type[OpenAIModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = adapter("gpt-test", base_url=server.url)
    monkeypatch.setenv("OPENAI_API_KEY", BAD_KEY)
    assert failure(model).kind == "AuthenticationError"
    monkeypatch.setenv("OPENAI_API_KEY", GOOD_KEY)
    assert ask(model).tool_calls


def test_the_request_log_records_run_and_step_but_never_the_key(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    ask(adapter("gpt-test", base_url=server.url), step=3, run_id="run-42")
    with urllib.request.urlopen(server.url.removesuffix("/v1") + "/_requests") as response:
        raw = response.read().decode()
    (entry,) = json.loads(raw)
    assert (entry["run_id"], entry["step"], entry["conversation_key"], entry["status"]) == (
        "run-42",
        "3",
        "run-42",
        200,
    )
    assert entry["model"] == "gpt-test" and entry["turn"] == 1
    assert GOOD_KEY not in raw and GOOD_KEY[:-4] not in raw


def test_request_params_reach_the_provider_as_given_even_ones_the_sdk_does_not_know(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    model = adapter(id="scripted", base_url=server.url, request_params={"metadata": {"a": "1"}, "x_beta_knob": 3})
    ask(model)
    (seen,) = server.requests
    assert {"model", "tools", "metadata", "x_beta_knob"} <= set(seen["params"])


def test_request_params_that_create_takes_as_options_keep_their_meaning(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    # As with `create(**request_params)` (Agno passes them so): extra_body merges into the body,
    # extra_query goes to the query string (Azure's api-version), extra_headers and timeout too.
    params = {"extra_body": {"top_k": 5}, "extra_query": {"api-version": "2025-01-01"},
              "extra_headers": {"X-Trace": "t1"}, "timeout": 7.0}  # fmt: skip
    ask(adapter(id="scripted", base_url=server.url, request_params=params))
    (seen,) = server.requests
    assert "top_k" in seen["params"] and not {"extra_body", "extra_query", "extra_headers", "timeout"} & set(
        seen["params"]
    )
    assert seen["query"] == ["api-version"] and seen["status"] == 200


def test_the_workers_timeout_holds_after_a_call_that_had_none(
    server: ScriptedServer, adapter: type[OpenAIModel]
) -> None:
    # A first call without a worker timeout falls back on RATCHET_MODEL_TIMEOUT (120 s); that
    # default must not stick to the model and outrank the worker's timeout on later calls.
    model = adapter(id="scripted", base_url=server.url)
    ask(model)
    server.configure(ScriptConfig(delay_s=3.0))
    with pytest.raises(ModelCallError) as caught:
        model.invoke([Message(role="user", content="slow")], [], context=CallContext(run_id="r", seq=2, timeout=0.5))
    assert caught.value.retryable and "timeout" in str(caught.value).lower()


def test_a_call_reads_no_ratchet_settings(
    server: ScriptedServer, adapter: type[OpenAIModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker reads the settings once, at start, and gives each call its timeout in the
    # CallContext; a call without one takes the default and reads nothing, so settings that
    # would not even load do not fail it.
    monkeypatch.setenv("RATCHET_MODEL_TIMEOUT", "not a number")
    monkeypatch.setenv("RATCHET_NOT_A_SETTING", "1")
    model = adapter(id="scripted", base_url=server.url)
    assert ask(model).tool_calls and model.timeout == 120.0


def test_describe_never_shows_the_key(adapter: type[OpenAIModel]) -> None:
    model = adapter("gpt-test", api_key=GOOD_KEY, base_url="http://user:pw@example.com/v1?key=x")
    assert model.describe() == f"{adapter.__name__}(id='gpt-test', base_url='http://example.com/v1')"
    assert GOOD_KEY not in model.describe() and GOOD_KEY not in repr(model)


def test_the_script_can_be_replaced_over_http(server: ScriptedServer) -> None:
    base = server.url.removesuffix("/v1")
    body = json.dumps({"tool_batches": 0, "final_text": "hi {user}"}).encode()
    put = urllib.request.Request(
        base + "/_script", data=body, method="PUT", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(put) as response:
        assert json.loads(response.read())["final_text"] == "hi {user}"
    assert ask(OpenAIChat("gpt-test", base_url=server.url), "there").content == "hi there"
    with urllib.request.urlopen(urllib.request.Request(base + "/_reset", data=b"", method="POST")):
        pass
    assert server.requests == []


def test_a_held_model_call_stays_in_flight_until_released_and_other_models_answer_meanwhile(
    server: ScriptedServer,
) -> None:
    server.configure(ScriptConfig(tool_batches=0, final_text="hi {user}"))
    server.holding.hold("slow")
    held: list[Any] = []
    caller = threading.Thread(target=lambda: held.append(ask(OpenAIChat("slow", base_url=server.url), "later")))
    caller.start()
    wait_until(lambda: any(r["model"] == "slow" for r in server.requests), timeout=10, what="the held call to arrive")

    # Another model answers while the held call waits
    assert ask(OpenAIChat("quick", base_url=server.url), "now").content == "hi now"
    assert caller.is_alive() and held == []

    server.holding.release()
    caller.join(10)
    assert [reply.content for reply in held] == ["hi later"]
    assert ask(OpenAIChat("slow", base_url=server.url), "again").content == "hi again"  # released: no longer held


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({"retry-after-ms": "1500"}, 1.5), ({"Retry-After": "3"}, 3.0), ({"Retry-After": "soon"}, None), ({}, None)],
)
def test_retry_after_is_read_from_either_header(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_retry_after_may_be_an_http_date() -> None:
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0


def test_the_server_runs_as_a_process_and_announces_its_url() -> None:
    config = json.dumps({"final_text": "from a process"})
    process = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.testing.server", "--port", "0", "--config", config],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("scripted model listening on http://127.0.0.1:") and line.endswith("/v1")
        url = line.rsplit(" ", 1)[1]
        with urllib.request.urlopen(url.removesuffix("/v1") + "/_script") as response:
            assert json.loads(response.read())["final_text"] == "from a process"
    finally:
        process.terminate()
        process.wait(timeout=5)
