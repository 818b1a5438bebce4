"""The limiter's rules, the same on Redis (a real one: each check one Lua script) and in one
process (`LocalLimiter`): places among a key's runs, waiting runs woken in order, token buckets
for a model's requests and tokens, a 429's block, and a Redis that is gone letting steps go.
On a private Redis: a limited model step costs one round trip, a tool step none."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
import redis

from orchestrator import Agent, RunStatus
from orchestrator.limits import LocalLimiter
from orchestrator.models.base import RateLimit
from orchestrator.ports import Ask, Limiter, Place, StepRef
from orchestrator.settings import Settings
from orchestrator.testing.script import ScriptConfig
from orchestrator.testing.waiting import wait_until
from tests.flow_support import limited, lookup, name
from tests.servers import RedisServer
from tests.support import CountingModel
from workers.redis import limiter as redis_flow
from workers.redis.limiter import RedisLimiter

SLOT = 30.0


@pytest.fixture(params=["redis", "local"])
def make_limiter(request: pytest.FixtureRequest, redis_url: str) -> Iterator[object]:
    """Builds limiters of one kind; a Redis one's keys, under a prefix of the test's own, go after it."""
    prefix = f"ratchet:flow:test-{uuid.uuid4().hex[:8]}:"

    def make(slot_seconds: float = SLOT) -> Limiter:
        if request.param == "local":
            return LocalLimiter(slot_seconds=slot_seconds)
        settings = Settings(run_slot_seconds=max(slot_seconds, 541.0))
        limiter = RedisLimiter(settings, redis_url, prefix=prefix)
        limiter.slot_ms = round(slot_seconds * 1000)
        return limiter

    yield make
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"{prefix}*"))
    if keys:
        client.delete(*keys)


@pytest.fixture
def limiter(make_limiter: object) -> Limiter:
    return make_limiter()  # type: ignore[operator, no-any-return]


def run(run_id: str, key: str = "tenant-a", limit: int = 2) -> Ask:
    return Ask(run_id=run_id, key=key, limit=limit)


def step(run_id: str, priority: int | None = None) -> StepRef:
    return StepRef(run_id=run_id, seq=0, kind="model", queue="q.model", priority=priority)


def test_a_key_has_at_most_its_limit_of_runs_in_progress_and_a_run_keeps_its_place(limiter: Limiter) -> None:
    assert limiter.admit(run("a")).admitted and limiter.admit(run("b")).admitted
    refused = limiter.admit(run("c"))
    assert (refused.reason, refused.admitted) == ("concurrency", False)
    assert 0 < refused.wait <= SLOT  # when the first place would expire unless renewed
    assert limiter.admit(run("a")).admitted  # its next step: it holds its place
    assert limiter.admit(run("c", key="tenant-b")).admitted  # another key counts its own runs
    assert limiter.release("a", 2) is None  # nobody waits
    assert limiter.admit(run("c")).admitted


def test_a_released_place_goes_to_the_waiting_run_of_highest_priority_then_first_parked(limiter: Limiter) -> None:
    assert limiter.admit(run("a", limit=1)).admitted
    for run_id, priority in (("b", None), ("c", None), ("d", 5)):
        assert not limiter.admit(run(run_id, limit=1)).admitted
        assert limiter.wait_for_room("tenant-a", 1, step(run_id, priority)) is False
    woken = limiter.release("a", 1)
    assert woken == step("d", 5)  # the whole step to publish, queue and priority included
    assert limiter.admit(run("d", limit=1)).admitted  # its place was kept for it
    assert not limiter.admit(run("e", limit=1)).admitted  # a newcomer does not take it
    assert limiter.release("d", 1) == step("b")
    assert limiter.release("b", 1) == step("c")
    assert limiter.release("c", 1) is None


def test_a_released_step_keeps_the_run_s_stored_trace_context(limiter: Limiter) -> None:
    traced = StepRef(
        run_id="b", seq=3, kind="tools", trace_context="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    )
    assert limiter.admit(run("a", limit=1)).admitted
    assert not limiter.admit(run("b", limit=1)).admitted
    assert limiter.wait_for_room("tenant-a", 1, traced) is False
    assert limiter.release("a", 1) == traced  # published under the stored parent, not the derived trace


def test_a_run_parked_when_a_place_came_free_meanwhile_takes_it_at_once(limiter: Limiter) -> None:
    assert limiter.admit(run("a", limit=1)).admitted
    assert not limiter.admit(run("b", limit=1)).admitted
    assert limiter.release("a", 1) is None  # b is not waiting yet: it is still being parked
    assert limiter.wait_for_room("tenant-a", 1, step("b")) is True  # so it publishes itself
    assert limiter.admit(run("b", limit=1)).admitted
    assert not limiter.admit(run("c", limit=1)).admitted


def test_a_run_cancelled_while_it_waits_is_not_woken(limiter: Limiter) -> None:
    assert limiter.admit(run("a", limit=1)).admitted
    for run_id in ("b", "c"):
        limiter.admit(run(run_id, limit=1))
        limiter.wait_for_room("tenant-a", 1, step(run_id))
    assert limiter.release("b", 1) is None  # cancelled while waiting: forgotten, no place freed
    assert limiter.release("a", 1) == step("c")
    assert limiter.release("unknown", 1) is None


def test_a_place_not_renewed_frees_itself(make_limiter: object) -> None:
    limiter: Limiter = make_limiter(slot_seconds=0.3)  # type: ignore[operator]
    assert limiter.admit(run("a", limit=1)).admitted
    assert not limiter.admit(run("b", limit=1)).admitted
    # A run whose worker died at its end never releases its place: it expires.
    wait_until(lambda: limiter.admit(run("b", limit=1)).admitted, timeout=5, what="a's place to expire")


def test_a_listed_place_is_freed_for_the_run_waiting_unless_its_run_renewed_it_since(limiter: Limiter) -> None:
    assert limiter.admit(run("a", limit=1)).admitted
    assert limiter.admit(run("x", key="tenant-b", limit=1)).admitted
    assert not limiter.admit(run("b", limit=1)).admitted
    assert limiter.wait_for_room("tenant-a", 1, step("b")) is False
    listed = {p.run_id: p for p in limiter.held()}
    assert {(p.key, r) for r, p in listed.items()} == {("tenant-a", "a"), ("tenant-b", "x")}

    # a goes on (a continued run): its next step renews the place, which the listing no longer frees
    def renewed() -> bool:
        assert limiter.admit(run("a", limit=1)).admitted
        return {p.run_id: p for p in limiter.held()}["a"].until != listed["a"].until

    wait_until(renewed, timeout=5, what="a renewal stamped later than the listing")
    assert limiter.free(listed["a"], 1) == (False, None)
    (now,) = [p for p in limiter.held() if p.run_id == "a"]
    assert limiter.free(now, 1) == (True, step("b"))  # freed as listed: b, waiting, takes it
    assert limiter.free(now, 1) == (False, None)  # once
    assert {p.run_id for p in limiter.held()} == {"b", "x"}
    assert limiter.release("a", 1) is None  # a's own release, late, frees nothing of b's
    assert not limiter.admit(run("c", limit=1)).admitted


def test_concurrent_admissions_never_exceed_the_limit(limiter: Limiter) -> None:
    admitted: list[str] = []
    barrier = threading.Barrier(12)

    def ask(i: int) -> None:
        barrier.wait()
        if limiter.admit(run(f"r{i}", limit=3)).admitted:
            admitted.append(f"r{i}")

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(admitted) == 3


def test_a_model_makes_at_most_its_requests_per_window(limiter: Limiter) -> None:
    model = f"m-{uuid.uuid4().hex[:6]}"
    # One request refills in per/requests = 2 s: a stall of the test between its asks (a loaded
    # machine) cannot refill the bucket before the fourth.
    rate = RateLimit(requests=3, per=6)
    asks = [Ask(run_id=f"r{i}", model=model, rate=rate) for i in range(4)]
    assert all(limiter.admit(a).admitted for a in asks[:3])  # a full bucket: a burst of the limit
    refused = limiter.admit(asks[3])
    assert refused.reason == "requests" and 0 < refused.wait <= 2.01  # one request refills in per/requests
    wait_until(lambda: limiter.admit(asks[3]).admitted, timeout=5, what="the bucket to refill")


def test_a_model_counts_tokens_and_a_call_corrects_its_estimate(limiter: Limiter) -> None:
    model = f"m-{uuid.uuid4().hex[:6]}"
    rate = RateLimit(tokens=100, per=60)
    assert limiter.admit(Ask(run_id="a", model=model, rate=rate, tokens=50)).admitted
    refused = limiter.admit(Ask(run_id="b", model=model, rate=rate, tokens=80))
    assert refused.reason == "tokens" and 17 < refused.wait <= 18.1  # 30 tokens at 100 a minute
    limiter.settle(model, rate, -50)  # the first call used nothing after all
    assert limiter.admit(Ask(run_id="b", model=model, rate=rate, tokens=80)).admitted
    limiter.settle(model, rate, 60)  # the second used 140: the bucket owes 40
    refused = limiter.admit(Ask(run_id="c", model=model, rate=rate, tokens=1))
    assert refused.reason == "tokens" and refused.wait > 24  # 41 tokens to refill


def test_a_correction_counts_when_the_next_admit_of_its_model_is_refused_for_concurrency(limiter: Limiter) -> None:
    model = f"m-{uuid.uuid4().hex[:6]}"
    rate = RateLimit(tokens=100, per=60)
    assert limiter.admit(Ask(run_id="a", key="k", limit=1, model=model, rate=rate, tokens=50)).admitted
    limiter.settle(model, rate, 40)  # a used 90
    assert limiter.admit(Ask(run_id="b", key="k", limit=1, model=model, rate=rate, tokens=1)).reason == "concurrency"
    # 10 tokens left, not 50: the correction went with b's admit though b was refused
    assert limiter.admit(Ask(run_id="c", model=model, rate=rate, tokens=20)).reason == "tokens"


def test_a_correction_is_kept_while_redis_cannot_be_reached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redis_flow, "LOG_EVERY", 0.3)  # not asked again for this long after a failure
    server = RedisServer(tmp_path / "redis").start()
    try:
        limiter = RedisLimiter(Settings(), server.url)
        model, rate = "m", RateLimit(tokens=100, per=60)
        limiter.settle(model, rate, 40)  # a call used 40 tokens more than its estimate
        server.stop()
        # The admit that carries the correction finds no Redis, and the next is not sent at all
        assert limiter.admit(Ask(run_id="b", model=model, rate=rate, tokens=1)).admitted
        assert limiter.admit(Ask(run_id="b", model=model, rate=rate, tokens=1)).admitted
        server.start()  # a new Redis on the same port, empty: the model's bucket is full again
        wait_until(lambda: limiter.admit(Ask(run_id="y", key="k", limit=1)).admitted and limiter.held(), timeout=5)
        # The correction reaches it with the model's next admit: 60 tokens left, not 100
        assert limiter.admit(Ask(run_id="c", model=model, rate=rate, tokens=70)).reason == "tokens"
    finally:
        server.stop()


def test_a_call_larger_than_the_token_limit_goes_when_the_bucket_is_full(limiter: Limiter) -> None:
    model = f"m-{uuid.uuid4().hex[:6]}"
    rate = RateLimit(tokens=100, per=60)
    assert limiter.admit(Ask(run_id="a", model=model, rate=rate, tokens=5000)).admitted


def test_a_refused_rate_takes_no_place_and_no_request(limiter: Limiter) -> None:
    model = f"m-{uuid.uuid4().hex[:6]}"
    rate = RateLimit(requests=1, per=60)
    assert limiter.admit(Ask(run_id="a", key="k", limit=2, model=model, rate=rate)).admitted
    assert limiter.admit(Ask(run_id="b", key="k", limit=2, model=model, rate=rate)).reason == "requests"
    assert limiter.admit(run("c", key="k")).admitted  # b took no place: a and c hold both
    assert limiter.admit(run("d", key="k")).reason == "concurrency"


def test_a_429_blocks_its_model_for_everyone_and_a_shorter_one_does_not_shorten_it(limiter: Limiter) -> None:
    model = f"m-{uuid.uuid4().hex[:6]}"
    ask = Ask(run_id="a", model=model, rate=RateLimit())
    assert limiter.admit(ask).admitted
    started = time.monotonic()
    limiter.block(model, 2.0)
    limiter.block(model, 0.01)
    refused = limiter.admit(ask)
    elapsed = time.monotonic() - started
    # What is left of the 2 s, however long the test paused between the calls (measured, not
    # guessed; a pause past the whole block fails on the reason, it cannot pass by chance)
    assert refused.reason == "blocked" and 2.0 - elapsed - 0.002 <= refused.wait <= 2.0, (refused, elapsed)
    assert limiter.admit(Ask(run_id="a", model="another", rate=RateLimit())).admitted
    wait_until(lambda: limiter.admit(ask).admitted, timeout=5, what="the block to end")


def test_a_key_whose_places_are_all_gone_leaves_redis_s_index_of_keys(redis_url: str) -> None:
    prefix = f"ratchet:flow:test-{uuid.uuid4().hex[:8]}:"
    limiter = RedisLimiter(Settings(), redis_url, prefix=prefix)
    client = redis.Redis.from_url(redis_url)
    try:
        assert limiter.admit(run("a", key="k1")).admitted and limiter.admit(run("b", key="k2")).admitted
        assert client.smembers(limiter.index) == {b"k1", b"k2"}
        assert limiter.release("a", 2) is None
        assert [(p.key, p.run_id) for p in limiter.held()] == [("k2", "b")]
        assert client.smembers(limiter.index) == {b"k2"}  # k1 had no place left at that read
    finally:
        client.delete(*client.keys(f"{prefix}*") or ["-"])


def test_a_redis_that_is_gone_lets_every_step_go(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RedisLimiter(Settings(), "redis://127.0.0.1:1/0")
    rate = RateLimit(requests=1)
    assert limiter.admit(Ask(run_id="a", key="k", limit=1, model="m", rate=rate)).admitted
    assert limiter.admit(Ask(run_id="b", key="k", limit=1, model="m", rate=rate)).admitted
    assert limiter.wait_for_room("k", 1, step("c")) is True
    assert limiter.release("a", 1) is None
    assert limiter.held() == [] and limiter.free(Place(key="k", run_id="a", until=1.0), 1) == (False, None)
    limiter.block("m", 1.0)
    assert "fails open" in caplog.text


def test_a_redis_that_hangs_costs_one_timeout_not_one_a_step() -> None:
    # Given a "Redis" that accepts connections and never answers (the kernel completes each
    # connection into the listener's backlog; nothing ever reads from it)
    with socket.create_server(("127.0.0.1", 0), backlog=16) as hung:
        limiter = RedisLimiter(Settings(), f"redis://127.0.0.1:{hung.getsockname()[1]}/0")
        rate = RateLimit(requests=1)

        # When steps ask it, one after the other
        for run in ("a", "b", "c"):
            assert limiter.admit(Ask(run_id=run, key="k", limit=1, model="m", rate=rate)).admitted
        assert limiter.wait_for_room("k", 1, step("d")) is True
        assert limiter.release("a", 1) is None
        limiter.block("m", 1.0)

        # Then only the first waited for it: one connection, whose reply never came; the rest
        # went on at once, failing open, without connecting again
        hung.setblocking(False)
        connections = []
        with suppress(BlockingIOError):
            while True:
                connections.append(hung.accept()[0])
        for conn in connections:
            conn.close()
        assert len(connections) == 1


def test_a_limited_model_step_costs_one_round_trip_and_a_tool_step_none(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    try:
        model = CountingModel(script=ScriptConfig(tool_batches=3))
        model.rate_limit = RateLimit(requests=1000, tokens=1_000_000)
        agent = Agent(name=name("trips"), model=model, tools=[lookup])
        limiter = RedisLimiter(Settings(), server.url)
        with limited(tmp_path, max_runs_per_key=2, limiter=limiter) as inline:
            limiter.admit(Ask(run_id="warm-up", model="other", rate=RateLimit()))  # the scripts loaded once
            limiter.release("warm-up", 1)
            stats = server.client()
            stats.config_resetstat()
            run_id = agent.start("q", user_id="u").run_id
            inline.run_until_idle()
            assert inline.client.get_run(run_id).status == RunStatus.COMPLETED
            commands = {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.info("commandstats").items()}
    finally:
        server.stop()
    # 4 model steps and 3 tool steps: one script each model step, one for the release at the end
    # (the commands the scripts run inside Redis are counted too, but cost no round trip)
    assert commands["evalsha"] == 5 and "script|load" not in commands and "eval" not in commands
