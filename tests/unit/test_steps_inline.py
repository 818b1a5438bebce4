"""Steps run by the in-memory dispatcher on a real SQLite store: retries and their countdowns,
tool errors, at-most-once tools, a batch delivered again with some results stored, stale
deliveries and continues. Lease expiry is shown by moving the store's clock. A real worker runs
retries in tests/integration/test_reliability.py (a Retry-After honoured by the broker's
countdown) and the sweeper in `ratchet sweep`'s test."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from orchestrator import Agent, RetryPolicy, RunBusyError, RunNotFoundError, RunStatus, Settings, ToolContext, tool
from orchestrator.errors import FencedError
from orchestrator.messages import Message
from orchestrator.ports import StepRef
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.script import Fault, ScriptConfig
from tests.support import Clock, CountingModel

S = RunStatus


def name() -> str:
    return f"steps-{uuid.uuid4().hex[:8]}"


def faults(*fault: Fault) -> CountingModel:
    return CountingModel(script=ScriptConfig(faults=list(fault)))


# ---------------------------------------------------------------- retries


def test_a_rate_limited_call_is_retried_with_its_retry_after_as_the_countdown_and_then_succeeds(
    inline: InMemoryDispatcher,
) -> None:
    model = faults(Fault(status=429, times=2, retry_after=0.4))
    agent = Agent(name=name(), model=model, retries=3)

    out = agent.run("hello")

    assert out.status == S.COMPLETED
    assert model.calls_for(out.run_id) == [0, 1, 2]  # each retry is published as the next seq
    countdowns = [s.countdown for s in inline.published]
    assert countdowns[0] is None and all(c is not None and c >= 0.4 for c in countdowns[1:])
    retries = [e for e in inline.store.get_events(out.run_id) if e["kind"] == "retry"]
    assert [e["detail"]["error"]["type"] for e in retries] == ["RateLimitError", "RateLimitError"]
    assert [e["detail"]["by"] for e in retries] == ["countdown", "countdown"]
    assert [e["detail"]["delay"] for e in retries] == pytest.approx(countdowns[1:], abs=1e-3)


def test_a_model_that_fails_forever_ends_in_error_after_the_agents_retries_with_the_conversation_kept(
    inline: InMemoryDispatcher,
) -> None:
    model = faults(Fault(status=500, times=None, message="overloaded"))
    agent = Agent(name=name(), model=model, retries=2, instructions="Be brief.")

    out = agent.run("hello")

    assert out.status == S.ERROR and out.error is not None
    assert out.error.type == "InternalServerError" and "HTTP 500" in out.error.message
    assert len(model.calls_for(out.run_id)) == 1 + agent.retries
    assert [(m.role, m.content) for m in out.messages] == [("system", "Be brief."), ("user", "hello")]


def test_a_stray_copy_of_a_failed_attempt_cannot_call_the_model_before_its_retry(
    inline: InMemoryDispatcher,
) -> None:
    # Given a call that was rate limited and parked for 1.5 s
    model = faults(Fault(status=429, times=1, retry_after=1.5))
    agent = Agent(name=name(), model=model, retries=3)
    inline.autorun = False
    run_id = agent.start("hello").run_id
    inline.run_next()

    # When another copy of the failed attempt's task arrives (a sweeper republish, a redelivery)
    inline.publish(StepRef(run_id=run_id, seq=0, kind="model"))
    inline.run_until_idle()

    # Then it was stale: the model was called again only by the retry, after its countdown
    assert inline.client.get_run(run_id).status == S.COMPLETED
    assert model.calls_for(run_id) == [0, 1]
    assert inline.now == pytest.approx(1.5)


def test_a_long_retry_after_parks_the_run_unpublished_until_the_sweeper_finds_it_due(
    tmp_path: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'runs.db'}", max_countdown=0.2)
    model = faults(Fault(status=429, times=1, retry_after=4.0))
    agent = Agent(name=name(), model=model, retries=3, retry_policy=RetryPolicy(base=0.05, max_delay=0.1))
    with in_memory(settings) as inline:
        monkeypatch.setattr(inline.store, "clock", clock)
        run_id = agent.start("hello").run_id

        # The retry waits for the sweeper: nothing is published, no worker would hold the run
        (retry,) = inline.store.get_events(run_id)
        assert retry["kind"] == "retry" and retry["detail"]["by"] == "sweeper"
        record = inline.store.get_record(run_id)
        assert record.status == S.QUEUED and record.lease_owner is None
        assert [s.seq for s in inline.published] == [0]
        assert not inline.sweep()  # not due yet

        clock.advance(4.0)
        assert inline.sweep().republished == [run_id]

        out = inline.client.get_run(run_id)
    assert out.status == S.COMPLETED
    assert model.calls_for(run_id) == [0, 1]


# ---------------------------------------------------------------- tools


def test_a_tool_error_becomes_a_tool_message_the_model_reads_and_the_run_completes(
    inline: InMemoryDispatcher,
) -> None:
    def broken(query: str) -> str:
        """A tool that always raises."""
        raise ValueError(f"this tool always fails on query={query}")

    agent = Agent(name=name(), model=CountingModel(), tools=[broken])

    out = agent.run("hello")

    assert out.status == S.COMPLETED
    assert [m.role for m in out.messages] == ["user", "assistant", "tool", "assistant"]
    result = out.messages[2]
    assert result.tool_call_error and result.content == "this tool always fails on query=hello"
    assert result.tool_name == "broken" and result.tool_args == {"query": "hello"}
    assert out.content == "Summary: this tool always fails on query=hello"  # what the model read


def test_an_interrupted_at_most_once_tool_is_not_run_again_and_the_run_errors_saying_so(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    charged: list[str] = []

    @tool(at_most_once=True)
    def charge_card(amount: int, ctx: ToolContext) -> str:
        """Charge the card (not idempotent)."""
        charged.append(ctx.idempotency_key)
        return "charged"

    agent = Agent(name=name(), model=CountingModel(), tools=[charge_card])
    inline.autorun = False
    run_id = agent.start("charge it").run_id
    inline.run_next()  # the model asks for the charge
    # A worker took the tool step, started the charge, and died before it reported back.
    store = inline.store
    doomed = store.claim(run_id, 1, "tools", owner="doomed", lease_seconds=30, max_attempts=5)
    assert doomed is not None
    call_id = doomed.messages[-1].calls[0].id
    store.record_tool_start(doomed, call_id, "charge_card")
    inline.run_until_idle()  # the step's own delivery: dropped, the claim is held
    clock.advance(31)  # its lease expires; the sweeper takes the step back

    assert inline.sweep().requeued == [run_id]
    inline.run_until_idle()

    out = inline.client.get_run(run_id)
    assert out.status == S.ERROR and out.error is not None
    assert out.error.type == "ToolInterruptedError"
    assert f"at-most-once tool call charge_card ({call_id}) started and never finished" in out.error.message
    assert "it was not run again" in out.error.message
    assert charged == []
    result = out.messages[-1]
    assert result.role == "tool" and result.tool_call_id == call_id and result.tool_call_error
    assert "outcome is unknown" in (result.content or "")

    # Continuing tells the model; the charge is still not run again.
    inline.autorun = True
    resumed = inline.client.continue_run(run_id).wait(timeout=0)
    assert resumed.status == S.COMPLETED and resumed.run_id == run_id
    assert charged == []
    assert [m.role for m in resumed.messages][-3:] == ["assistant", "tool", "assistant"]


def test_a_tool_batch_delivered_again_with_two_of_its_three_results_stored_runs_only_the_third(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    ran: list[str] = []

    def work(key: str) -> str:
        """Do the work named `key`."""
        ran.append(key)
        return f"{key}: done"

    script = ScriptConfig(
        batches=[[{"tool": "work", "arguments": {"key": k}} for k in "abc"]], final_text="{tool_results}"
    )
    agent = Agent(name=name(), model=CountingModel(script=script), tools=[work])
    inline.autorun = False
    run_id = agent.start("go").run_id
    inline.run_next()  # the model asks for a, b and c in one batch
    # Given a worker that took the batch, committed a's and b's results as they finished (the
    # tool step's own write), and died before c's
    store = inline.store
    doomed = store.claim(run_id, 1, "tools", owner="doomed", lease_seconds=30, max_attempts=5)
    assert doomed is not None
    calls = doomed.messages[-1].calls
    for call, key in zip(calls[:2], "ab", strict=True):
        result = Message(role="tool", tool_call_id=call.id, tool_name="work", content=f"{key}: done (first worker)")
        store.append_tool_result(doomed, result)

    # When its lease expires and the batch's message, never acknowledged, is delivered again
    clock.advance(31)
    inline.run_until_idle()

    # Then only c ran, and the transcript holds each call's result once, a's and b's as first stored
    assert ran == ["c"]
    out = inline.client.get_run(run_id)
    assert out.status == S.COMPLETED, out.error
    results = [(m.tool_call_id, m.content) for m in out.messages if m.role == "tool"]
    assert results == [
        (calls[0].id, "a: done (first worker)"), (calls[1].id, "b: done (first worker)"), (calls[2].id, "c: done"),
    ]  # fmt: skip
    assert out.content == "a: done (first worker); b: done (first worker); c: done"


# ---------------------------------------------------------------- continue


def test_continue_of_a_running_run_is_refused_while_its_lease_is_live_and_resumes_it_after(
    inline: InMemoryDispatcher, clock: Clock
) -> None:
    model = CountingModel()
    agent = Agent(name=name(), model=model)
    client = inline.client
    inline.autorun = False
    run_id = agent.start("hello").run_id
    # A worker took the first step and froze (its task is still queued).
    frozen = client.store.claim(run_id, 0, "model", owner="frozen-worker", lease_seconds=30, max_attempts=5)
    assert frozen is not None

    with pytest.raises(RunBusyError, match="RUNNING on frozen-worker and its lease is live"):
        client.continue_run(run_id)

    clock.advance(31)  # the lease expires
    handle = client.continue_run(run_id)
    record = client.store.get_record(run_id)
    assert handle.run_id == run_id and record.status == S.QUEUED and record.epoch == frozen.epoch + 1
    assert inline.run_until_idle() == 2

    out = handle.wait(timeout=0)
    assert out.status == S.COMPLETED and out.run_id == run_id
    assert [m.role for m in out.messages] == ["user", "assistant"]
    # The first task (seq 0) was stale by then and dropped: one model call in all.
    assert model.calls_for(run_id) == [1]
    with pytest.raises(FencedError):
        client.store.commit_step(
            frozen, [Message(role="assistant", content="late")], status=S.COMPLETED, next_step=None, publish_grace=60
        )


def test_continue_on_an_unknown_run_id_says_so(inline: InMemoryDispatcher) -> None:
    with pytest.raises(RunNotFoundError, match="no run with run_id 'no-such-run'"):
        inline.client.continue_run("no-such-run")
