"""The Redis delta sink on a real Redis: deltas sent in the background, in order, all stored when
their run's `flush` returns; a reader's `wait` woken by a delta; a Redis that is gone never
fails the writer; a run's stream bounded by RATCHET_STREAM_MAXLEN and expiring
RATCHET_STREAM_TTL after its last write."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from celery.exceptions import SoftTimeLimitExceeded

from orchestrator import Agent, RunStatus
from orchestrator.events import RunEvent, event_id, live_key
from orchestrator.settings import Settings
from orchestrator.testing import in_memory
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.scripted_model import ScriptedModel
from orchestrator.testing.waiting import wait_until
from workers.redis.delta_sink import FLUSH_TIMEOUT, KEY, RedisDeltaSink


def delta(run_id: str, k: int) -> RunEvent:
    return RunEvent(
        id=event_id(live_key(0, 1, k)), event="RunContent", run_id=run_id, seq=0, attempt=1, created_at=time.time(),
        content=f"w{k} ",
    )  # fmt: skip


@pytest.fixture
def run_ids(redis_url: str) -> Iterator[list[str]]:
    ids = [f"sink-{uuid.uuid4().hex}" for _ in range(4)]
    yield ids
    redis.Redis.from_url(redis_url).delete(*(KEY.format(run_id=r) for r in ids))


def test_deltas_written_by_several_steps_at_once_are_all_stored_in_order_when_each_run_flushes(
    settings: Settings, run_ids: list[str]
) -> None:
    sink = RedisDeltaSink(settings, settings.broker_url)
    stored: dict[str, list[str | None]] = {}

    def step(run_id: str) -> None:
        for k in range(1, 101):
            sink.write(delta(run_id, k))
        sink.flush(run_id)
        # Read at once, before the other steps flush: this run's own flush is what stored them.
        stored[run_id] = [e.content for e in sink.read(run_id, None)[0]]

    threads = [threading.Thread(target=step, args=(r,)) for r in run_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    assert stored == {r: [f"w{k} " for k in range(1, 101)] for r in run_ids}


def test_a_reader_waiting_on_a_streamed_run_wakes_when_a_delta_is_written_not_at_its_timeout(
    settings: Settings, run_ids: list[str]
) -> None:
    sink = RedisDeltaSink(settings, settings.broker_url)
    run_id = run_ids[0]
    writer = threading.Timer(0.1, lambda: sink.write(delta(run_id, 1)))
    writer.start()

    started = time.monotonic()
    woken, cursor = sink.wait(run_id, None, timeout=10)
    waited = time.monotonic() - started
    writer.join()

    assert waited < 5, f"the wait ran to its timeout ({waited:.1f}s) although a delta came after 0.1s"
    assert [e.content for e in woken] == ["w1 "]  # what woke it, so the reader need not read again
    assert (woken, cursor) == sink.read(run_id, None)
    started = time.monotonic()
    assert sink.wait(run_id, cursor, timeout=0.05) == ([], cursor)  # nothing after the cursor: its timeout
    assert time.monotonic() - started >= 0.04


def test_a_sink_whose_redis_is_gone_drops_the_deltas_and_never_fails_or_holds_up_the_step(
    settings: Settings, run_ids: list[str]
) -> None:
    sink = RedisDeltaSink(settings, "redis://127.0.0.1:1/0")
    run_id = run_ids[0]

    started = time.monotonic()
    for k in range(1, 30):
        sink.write(delta(run_id, k))
    sink.flush(run_id)

    assert time.monotonic() - started < 5


def test_an_event_that_cannot_be_written_drops_its_own_run_only_not_the_others_in_its_batch(
    settings: Settings, run_ids: list[str]
) -> None:
    sink = RedisDeltaSink(settings, settings.broker_url)
    bad, good = run_ids[0], run_ids[1]
    unwritable = delta(bad, 1).model_copy(update={"content": "\ud800"})  # no JSON holds a lone surrogate

    sink._send([unwritable, delta(good, 1), delta(good, 2)])  # one batch, as the sender thread takes it
    sink.flush(good)

    assert [e.content for e in sink.read(good, None)[0]] == ["w1 ", "w2 "]
    assert sink.read(bad, None)[0] == []


def test_a_batch_stores_each_runs_events_as_one_entry_read_back_in_order(
    settings: Settings, run_ids: list[str], redis_url: str
) -> None:
    sink = RedisDeltaSink(settings, settings.broker_url)
    a, b = run_ids[0], run_ids[1]
    sink.write(delta(a, 1))  # a step's first event goes out alone, at once
    sink.flush(a)

    sink._send([delta(a, 2), delta(b, 1), delta(a, 3), delta(b, 2)])  # one batch, as the sender thread takes it

    r = redis.Redis.from_url(redis_url)
    assert (r.xlen(KEY.format(run_id=a)), r.xlen(KEY.format(run_id=b))) == (2, 1)  # one XADD a run, not an event
    events, cursor = sink.read(a, None)
    assert [e.content for e in events] == ["w1 ", "w2 ", "w3 "]
    assert [e.content for e in sink.read(b, None)[0]] == ["w1 ", "w2 "]
    sink.write(delta(a, 4))
    sink.flush(a)
    assert [e.content for e in sink.wait(a, cursor, timeout=5)[0]] == ["w4 "]  # the cursor is past the batch


def test_a_step_interrupted_while_its_flush_sends_other_runs_deltas_leaves_their_text_without_a_hole(
    settings: Settings, run_ids: list[str]
) -> None:
    # Given run Y's first delta sent, then Y's second and X's two queued while the sender thread
    # has not taken them (held off here, as a busy process's thread switch can), and X's step hits
    # its soft time limit while its flush sends that batch
    x, y = run_ids[:2]
    sink = RedisDeltaSink(settings, settings.broker_url)
    hold = threading.Event()
    sink._flusher = threading.Thread(target=hold.wait, daemon=True)
    sink._flusher.start()
    sink.write(delta(y, 1))
    for event in (delta(y, 2), delta(x, 1), delta(x, 2)):
        sink.write(event)
    pipeline = sink.client.pipeline

    class Interrupted:  # the limit lands while the batch is on its way: whether it arrived is unknown
        def __init__(self, real: redis.client.Pipeline) -> None:
            self.real = real

        def __getattr__(self, name: str) -> object:
            return getattr(self.real, name)

        def execute(self) -> None:
            raise SoftTimeLimitExceeded()

    sink.client.pipeline = lambda **kw: Interrupted(pipeline(**kw))  # type: ignore[method-assign]
    with pytest.raises(SoftTimeLimitExceeded):
        sink.flush(x)
    sink.client.pipeline = pipeline  # type: ignore[method-assign]
    hold.set()
    sink._flusher = None

    # When Y's step goes on and flushes
    sink.write(delta(y, 3))
    sink.flush(y)

    # Then a reader of Y sees a prefix of its text, never "w1 w3"
    seen = [e.content for e in sink.read(y, None)[0]]
    assert seen == ["w1 ", "w2 ", "w3 "][: len(seen)], seen
    # and the sink goes on: Y's next step streams again
    sink.write(delta(y, 4))
    sink.flush(y)
    assert sink.read(y, None)[0][-1].content == "w4 "


@pytest.mark.parametrize("interrupted", ["write", "flush"])
def test_a_step_interrupted_between_taking_a_batch_and_sending_it_leaves_the_sink_free(
    redis_url: str, run_ids: list[str], interrupted: str
) -> None:
    # Given a step whose soft time limit lands just after its thread took a batch to send (its
    # first delta, sent on its own thread by `write`; or what its `flush` found queued), before
    # the send began: the signal's handler raises there
    a, b = run_ids[:2]
    sink = RedisDeltaSink(Settings(broker_url=redis_url), redis_url)  # no database: the sink needs none
    take = sink._take

    def take_then_the_signal() -> list[RunEvent]:
        take()  # the batch is taken (the sink busy with it), then the signal lands
        raise SoftTimeLimitExceeded()

    if interrupted == "flush":
        hold = threading.Event()  # the sender thread does not take the queue first
        sink._flusher = threading.Thread(target=hold.wait, daemon=True)
        sink._flusher.start()
        sink.write(delta(a, 1))
        sink.write(delta(a, 2))  # queued: a's first went out on the step's thread
    sink._take = take_then_the_signal  # type: ignore[method-assign]
    with pytest.raises(SoftTimeLimitExceeded):
        sink.flush(a) if interrupted == "flush" else sink.write(delta(a, 1))
    del sink._take
    if interrupted == "flush":
        hold.set()
        sink._flusher = None

    # When another run's step streams and flushes
    done = threading.Event()

    def step() -> None:
        sink.write(delta(b, 1))
        sink.write(delta(b, 2))
        sink.flush(b)
        done.set()

    threading.Thread(target=step, daemon=True).start()

    # Then its flush returns (it would have waited FLUSH_TIMEOUT for a batch never sent) with
    # its text stored, and the interrupted run's text has no hole once its next step flushes
    assert done.wait(FLUSH_TIMEOUT / 2), "the flush waited for a batch an interrupted step had taken"
    assert [e.content for e in sink.read(b, None)[0]] == ["w1 ", "w2 "]
    sink.write(delta(a, 3))  # a is given up for the interrupted step: dropped
    sink.flush(a)
    seen = [e.content for e in sink.read(a, None)[0]]
    assert seen == ["w1 ", "w2 "][: len(seen)], seen


# ---------------------------------------------------------------- bounded and expiring


def test_a_runs_stream_keeps_about_stream_maxlen_entries_the_newest_however_many_are_written(
    run_ids: list[str], redis_url: str
) -> None:
    maxlen, written = 50, 1000
    sink = RedisDeltaSink(Settings(broker_url=redis_url, stream_maxlen=maxlen), redis_url)
    run_id = run_ids[0]
    for k in range(1, written + 1):
        sink.write(delta(run_id, k))
        sink.flush(run_id)  # one entry each: nothing else is queued when it is sent

    # Trimmed approximately (XADD MAXLEN ~): Redis drops whole nodes of the stream, oldest
    # first, so it keeps at least RATCHET_STREAM_MAXLEN entries and at most a node's more.
    r = redis.Redis.from_url(redis_url)
    node = int(r.config_get("stream-node-max-entries")["stream-node-max-entries"])
    kept = r.xlen(KEY.format(run_id=run_id))
    assert maxlen <= kept <= maxlen + node < written
    assert [e.content for e in sink.read(run_id, None)[0]] == [f"w{k} " for k in range(written - kept + 1, written + 1)]


def test_a_runs_stream_expires_stream_ttl_after_its_last_write(run_ids: list[str], redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    key = KEY.format(run_id=run_ids[0])
    sink = RedisDeltaSink(Settings(broker_url=redis_url, stream_ttl=120), redis_url)
    sink.write(delta(run_ids[0], 1))
    sink.flush(run_ids[0])
    assert 110 < r.ttl(key) <= 120
    # Each write renews it: the stream outlives its last write, not its first, by the TTL
    r.expire(key, 5)
    sink.write(delta(run_ids[0], 2))
    sink.flush(run_ids[0])
    assert 110 < r.ttl(key) <= 120

    # And once nothing writes (the run ended, or its worker died), the stream goes by itself
    short = RedisDeltaSink(Settings(broker_url=redis_url, stream_ttl=1), redis_url)
    short.write(delta(run_ids[1], 1))
    short.flush(run_ids[1])
    assert 0 < r.ttl(KEY.format(run_id=run_ids[1])) <= 1
    wait_until(lambda: not r.exists(KEY.format(run_id=run_ids[1])), timeout=10, what="the stream to expire")


def test_a_streamed_run_leaves_its_stream_to_expire_stream_ttl_after_its_final_delta(
    settings: Settings, redis_url: str
) -> None:
    config = ScriptConfig(final_text="Otters hold hands while they sleep")
    agent = Agent(name=f"ttl-{uuid.uuid4().hex[:8]}", model=ScriptedModel(script=config))
    with in_memory(settings.model_copy(update={"stream_ttl": 120})) as inline:
        out = inline.client.start(agent.name, input="otters?", stream=True).wait(10)
    key = KEY.format(run_id=out.run_id)
    r = redis.Redis.from_url(redis_url)
    try:
        assert out.status == RunStatus.COMPLETED
        assert r.xlen(key) > 0  # its deltas went to the run's stream
        assert 0 < r.ttl(key) <= 120  # RATCHET_STREAM_TTL from the final delta on, not the default hour
    finally:
        r.delete(key)
