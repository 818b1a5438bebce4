"""A worker dies in the middle of a streamed reply: a reader that follows the run through it sees
the partial reply, StepRestarted, then the whole reply of the attempt that committed."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from orchestrator import RunStatus
from orchestrator.events import RunEvent, drop_restarted
from orchestrator.testing.waiting import wait_until
from tests.chaos.harness import SHORT_LEASE, Cluster

pytestmark = pytest.mark.chaos

#: Long enough that the kill, made after the third word, lands well before the last one.
REPLY = " ".join(f"word{i}" for i in range(1, 41))


def deltas(events: list[RunEvent]) -> list[RunEvent]:
    return [e for e in events if e.event == "RunContent"]


def text(events: list[RunEvent]) -> str:
    return "".join(e.content or "" for e in deltas(events))


def durable(events: list[RunEvent]) -> list[RunEvent]:
    return [e for e in events if e.event not in ("RunContent", "StepRestarted")]


def test_a_worker_killed_in_the_middle_of_a_streamed_reply_restarts_the_reply_for_a_reader_that_follows_through(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(**SHORT_LEASE)
    # Given a streamed run whose reply (no tool call) comes a word every 0.1 s, on one worker
    cluster.script(batches=[], final_text=REPLY, chunk_delay_s=0.1)
    first = cluster.start_worker()
    run_id = cluster.start_run(stream=True)
    # And a reader that follows it from the start, in a thread
    seen: list[RunEvent] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            for event in cluster.client.stream(run_id, timeout=60):
                seen.append(event)
        except BaseException as exc:  # reported by the test thread
            failed.append(exc)

    reader = threading.Thread(target=read, name="stream-reader", daemon=True)
    reader.start()
    wait_until(lambda: len(deltas(seen)) >= 3 or failed, timeout=30, what="the reader to see three deltas")
    assert not failed, failed

    # When the worker is SIGKILLed mid-reply, the model answers faster from now on, and a second
    # worker (with the sweeper's beat) takes the step back once its short lease expires
    first.kill()
    cluster.script(batches=[], final_text=REPLY, chunk_delay_s=0.01)
    cluster.start_worker(beat=True)

    # Then the run completes with one assistant message, whose text is the new attempt's
    out = cluster.assert_invariants([run_id], extra_model_calls={0: 1})[run_id]
    assert out.status == RunStatus.COMPLETED
    assert [m.role for m in out.messages] == ["system", "user", "assistant"]
    assert out.content == REPLY
    assert cluster.model_calls(run_id)[0] == 2
    reader.join(30)
    assert not reader.is_alive() and not failed, failed

    # And the reader saw the partial reply, StepRestarted, then the whole new reply, in id order
    events = list(seen)
    restart = next(i for i, e in enumerate(events) if e.event == "StepRestarted")
    before, restarted, after = events[1:restart], events[restart], events[restart + 1 : -1]
    assert events[0].event == "RunStarted" and events[-1].event == "RunCompleted"
    assert [e.event for e in before] == ["RunContent"] * len(before) and 3 <= len(before) < len(REPLY.split())
    assert [e.event for e in after] == ["RunContent"] * len(after)
    assert REPLY.startswith(text(before))
    assert restarted.seq == 0 and restarted.attempt is not None
    assert {e.attempt for e in before} == {before[0].attempt} and before[0].attempt < restarted.attempt  # type: ignore[operator]
    assert {e.attempt for e in after} == {restarted.attempt}
    assert text(after) == out.content == events[-1].content
    assert [e.key for e in events] == sorted({e.key for e in events})
    # Dropping the superseded deltas leaves exactly the committed text
    assert text(drop_restarted(events)) == out.content
    assert deltas(drop_restarted(events)) == after

    # And a reader that comes after the run ended sees the same events
    late = list(cluster.client.stream(run_id, timeout=30))
    assert durable(late) == durable(events)
    assert late == events
