"""What models and tools return is untrusted, and a run never wedges on it: text the store cannot
hold (NUL, lone surrogates), names and ids longer than their columns, tools that raise SystemExit
or exceptions that cannot be printed, arguments nested too deeply, a model that never stops
calling tools. On SQLite and PostgreSQL. What is under test is the engine and the store, so the
steps run inline (`orchestrator.testing.in_memory`); a tool that raises SystemExit or
KeyboardInterrupt runs on a real Celery worker, whose pool must not take it for its own shutdown.

The model here is an adapter of the test's own (`Replies`, a `Model` like OpenAIChat), so a test
can hand the engine exactly the reply a misbehaving provider would.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any

import pytest
from pydantic import AfterValidator

from orchestrator import Agent, Client, RunOutput, RunStatus
from orchestrator.messages import Message, ToolCall
from orchestrator.models.base import CallContext, Model, ModelReply, ToolSpec
from orchestrator.settings import Settings
from orchestrator.testing import InMemoryDispatcher, in_memory

S = RunStatus
NOTE = "the run store cannot hold (NUL or lone surrogates) were escaped"


class Replies(Model):
    """Answers the k-th model call of a run (k = assistant messages so far) with `replies[k]`,
    the last one again once they run out."""

    def __init__(self, *replies: ModelReply) -> None:
        self.id = "replies"
        self.replies = replies

    def invoke(self, messages: Sequence[Message], tools: Sequence[ToolSpec], *, context: CallContext) -> ModelReply:
        turn = sum(1 for m in messages if m.role == "assistant")
        return self.replies[min(turn, len(self.replies) - 1)]


def call(name: str, arguments: str = "{}", call_id: str = "call-1") -> ModelReply:
    return ModelReply(tool_calls=[ToolCall(id=call_id, name=name, arguments=arguments)])


def answer(text: str = "done") -> ModelReply:
    return ModelReply(content=text)


class Counter:
    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.n += 1


def agent(model: Model, tools: Sequence[Callable[..., Any]] = (), **kwargs: Any) -> Agent:
    return Agent(name=f"untrusted-{uuid.uuid4().hex[:8]}", model=model, tools=tools, **kwargs)


def run(settings: Settings, a: Agent, text: str = "hello") -> RunOutput:
    return Client(settings).start(a.name, input=text).wait(timeout=30)


@pytest.fixture
def inline(settings: Settings) -> Iterator[InMemoryDispatcher]:
    """Steps of runs started with these settings run inline, on this test's database."""
    with in_memory(settings) as dispatcher:
        yield dispatcher


def tool_messages(out: RunOutput) -> list[Message]:
    return [m for m in out.messages if m.role == "tool"]


@pytest.mark.usefixtures("inline")
def test_a_tool_result_the_store_cannot_hold_is_stored_escaped_and_the_tool_runs_once(settings: Settings) -> None:
    # Given a tool that returns a NUL and a file name as os.listdir gives it for bytes not UTF-8
    ran = Counter()

    def list_files() -> str:
        """List files."""
        ran()
        return "a\x00b " + b"caf\xe9.txt".decode("utf-8", "surrogateescape")

    out = run(settings, agent(Replies(call("list_files"), answer()), [list_files]))

    # Then the run completes, the result is kept with the characters escaped and a note saying so
    assert out.status == S.COMPLETED, out.error
    [result] = tool_messages(out)
    assert result.content is not None and result.content.startswith("a\\x00b caf\\udce9.txt\n")
    assert f"2 character(s) {NOTE}" in result.content and not result.tool_call_error
    assert ran.n == 1


@pytest.mark.usefixtures("inline")
def test_a_tool_error_text_the_store_cannot_hold_is_stored_escaped(settings: Settings) -> None:
    def fail() -> str:
        """Fail."""
        raise ValueError("bad \x00 byte and \ud800 half")

    out = run(settings, agent(Replies(call("fail"), answer()), [fail]))

    assert out.status == S.COMPLETED, out.error
    [result] = tool_messages(out)
    assert result.tool_call_error and result.content is not None
    assert result.content.startswith("bad \\x00 byte and \\ud800 half") and NOTE in result.content


@pytest.mark.usefixtures("inline")
def test_a_reply_the_store_cannot_hold_is_stored_escaped(settings: Settings) -> None:
    out = run(settings, agent(Replies(answer("hi \x00 there \udcff"))))

    assert out.status == S.COMPLETED, out.error
    assert out.content is not None and out.content.startswith("hi \\x00 there \\udcff\n") and NOTE in out.content
    assert out.messages[-1].content == out.content


@pytest.mark.usefixtures("inline")
def test_tool_names_and_call_ids_longer_than_their_columns_or_with_nul_are_fitted_and_answered(
    settings: Settings,
) -> None:
    # Given a model that calls a 300-character tool name under a 200-character id, and one with a NUL id
    long_name, long_id = "t" * 300, "c" * 200
    batch = ModelReply(
        tool_calls=[ToolCall(id=long_id, name=long_name), ToolCall(id="id\x00\udcff", name="echo", arguments="{}")]
    )
    ran = Counter()

    def echo() -> str:
        """Echo."""
        ran()
        return "echoed"

    out = run(settings, agent(Replies(batch, answer()), [echo]))

    # Then both calls are answered under ids the store holds, which the stored assistant message uses too
    assert out.status == S.COMPLETED, out.error
    assistant = next(m for m in out.messages if m.role == "assistant" and m.tool_calls)
    ids = [c.id for c in assistant.calls]
    assert all(len(i) <= 128 and "\x00" not in i for i in ids) and len(set(ids)) == 2
    results = {m.tool_call_id: m for m in tool_messages(out)}
    assert set(results) == set(ids)
    unknown = results[ids[0]]
    assert unknown.tool_call_error and unknown.content is not None and "unknown tool" in unknown.content
    assert unknown.tool_name is not None and len(unknown.tool_name) <= 256
    assert results[ids[1]].content == "echoed" and ran.n == 1


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@pytest.mark.usefixtures("worker")
@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (SystemExit(2), "the tool raised SystemExit(2)"),
        (KeyboardInterrupt(), "the tool raised KeyboardInterrupt()"),
        (Unprintable(), "<Unprintable whose message could not be read: RuntimeError: no text for you>"),
    ],
    ids=["SystemExit", "KeyboardInterrupt", "unprintable"],
)
def test_a_tool_that_exits_or_cannot_say_why_it_failed_is_a_tool_error_the_model_reads(
    settings: Settings, raised: BaseException, expected: str
) -> None:
    ran = Counter()

    def cli_tool() -> str:
        """A tool wrapping a command line."""
        ran()
        raise raised

    out = run(settings, agent(Replies(call("cli_tool"), answer()), [cli_tool]))

    assert out.status == S.COMPLETED, out.error
    [result] = tool_messages(out)
    assert result.tool_call_error and result.content == expected
    assert ran.n == 1


@pytest.mark.usefixtures("inline")
def test_tools_of_a_batch_that_exit_or_cannot_say_why_are_tool_errors_and_the_others_results_are_kept(
    settings: Settings,
) -> None:
    def exits() -> str:
        """Exit."""
        raise SystemExit(2)

    def unprintable() -> str:
        """Raise."""
        raise Unprintable()

    def fine() -> str:
        """Work."""
        return "ok"

    batch = ModelReply(
        tool_calls=[ToolCall(id=f"c{i}", name=n) for i, n in enumerate(["exits", "unprintable", "fine"])]
    )
    out = run(settings, agent(Replies(batch, answer()), [exits, unprintable, fine]))

    assert out.status == S.COMPLETED, out.error
    results = {m.tool_name: (m.tool_call_error, m.content) for m in tool_messages(out)}
    assert results["fine"] == (False, "ok")
    assert results["exits"] == (True, "the tool raised SystemExit(2)")
    assert results["unprintable"][0] and "could not be read" in (results["unprintable"][1] or "")


@pytest.mark.usefixtures("inline")
def test_arguments_nested_too_deeply_are_a_tool_error_not_a_failed_run(settings: Settings) -> None:
    ran = Counter()

    def takes(data: list[Any]) -> str:
        """Take data."""
        ran()
        return "taken"

    deep = '{"data": ' + "[" * 5000 + "]" * 5000 + "}"
    out = run(settings, agent(Replies(call("takes", deep), answer()), [takes]))

    assert out.status == S.COMPLETED, out.error
    [result] = tool_messages(out)
    assert result.tool_call_error and result.content is not None and "nested too deeply" in result.content
    assert result.tool_args == {"_raw": deep} and ran.n == 0


@pytest.mark.usefixtures("inline")
def test_a_run_stopped_by_max_tool_batches_owes_nothing_and_continues_with_a_new_user_message(
    settings: Settings,
) -> None:
    # Given an agent allowed one tool batch per user message, and a model that asks for a second
    ran = Counter()

    def look() -> str:
        """Look."""
        ran()
        return "seen"

    a = agent(
        Replies(call("look", call_id="a"), call("look", call_id="b"), answer("enough")), [look], max_tool_batches=1
    )
    failed = run(settings, a)

    # Then the run stops in ERROR with the second batch answered as not run
    assert failed.status == S.ERROR and failed.error is not None and failed.error.type == "ToolBatchLimitError"
    assert "Continue the run with a new user message" in failed.error.message
    last = tool_messages(failed)[-1]
    assert last.tool_call_id == "b" and last.tool_call_error and "not run" in (last.content or "")
    assert ran.n == 1

    # When it is continued with a new user message, it completes in place
    out = Client(settings).continue_run(failed.run_id, input="that is enough looking").wait(timeout=30)
    assert out.status == S.COMPLETED and out.run_id == failed.run_id and out.content == "enough"
    assert out.messages[: len(failed.messages)] == failed.messages
    assert ran.n == 1


def refuse(value: int) -> int:
    """A validator that raises what pydantic does not turn into a ValidationError."""
    raise TypeError("picky validator")


class ExitWithUnprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.usefixtures("inline")
def test_one_call_of_a_batch_that_fails_outside_its_tool_loses_no_other_calls_result(settings: Settings) -> None:
    # Given a batch where one call's arguments fail a validator with TypeError (which pydantic
    # does not wrap), one exits with an unprintable code, one is slow and one is fast
    slow_ran = Counter()
    release = threading.Event()

    def picky(value: Annotated[int, AfterValidator(refuse)]) -> str:
        """Refuses everything."""
        return "never"

    def exits() -> str:
        """Exit with a code that cannot be printed."""
        release.set()
        raise SystemExit(ExitWithUnprintable())

    def slow() -> str:
        """Slow."""
        release.wait(10)
        slow_ran()
        return "slow done"

    def fast() -> str:
        """Fast."""
        return "fast done"

    tools = [picky, exits, slow, fast]
    names = ["picky", "exits", "slow", "fast"]
    args = ['{"value": 1}', "{}", "{}", "{}"]
    calls = [ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(zip(names, args, strict=True))]
    batch = ModelReply(tool_calls=calls)
    out = run(settings, agent(Replies(batch, answer()), tools))

    # Then every call is answered once and the slow call ran once
    assert out.status == S.COMPLETED, out.error
    results = {m.tool_name: (m.tool_call_error, m.content or "") for m in tool_messages(out)}
    assert set(results) == set(names)
    assert results["picky"][0] and "TypeError: picky validator" in results["picky"][1]
    assert results["exits"][0] and results["exits"][1].startswith("the tool raised SystemExit(<")
    assert results["slow"] == (False, "slow done") and results["fast"] == (False, "fast done")
    assert slow_ran.n == 1
