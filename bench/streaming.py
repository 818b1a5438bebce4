"""Item 8: streaming. The time to the first token a `Client.stream` reader sees, and what
streaming costs a step.

Time to first token (TTFT): the producer (this process) calls `Client.start(stream=True)` and
reads `Client.stream` until its first RunContent; the worker subprocess streams one model call
through the openai client from the scripted HTTP server (in this process) and publishes each
delta to the run's Redis stream. Interleaved with the floor: a producer that writes a row and
sends one bare Celery hop (`bench.stream_hop`), whose hop streams the same reply from the same
server through the openai client and XADDs each text delta to a Redis stream (with its EXPIRE,
one round trip, as Ratchet's sink writes), then commits its one transaction; the producer blocks
on XREAD of that stream, the cheapest way to get a delta to it, and stops the clock at the first
entry. The server sends the reply at once (no delay before or between its chunks), so what is
timed is the path, not the model. In a second pass, interleaved with Ratchet again, a producer
reads the same floor by polling its stream on the schedule `Client.stream` polls
(`orchestrator.reader.delays`): Ratchet's ratio to it is what is left of the gap once the
reader's polling is taken out. Each pass alternates its two sides run by run, so each side's
worker has been idle for one run of the other's when its own starts. Two more marks on each side say where
the time goes: when the model request reached the server (its request log) and when the worker
wrote the first delta (the delta's own timestamp), both on the wall clock of this one machine.

Cost of a streamed step: one run of `TalkingModel` steps (a 29-word sentence at each model step,
then its tool batch; bench/agents.py) started with stream=True, against the same run without,
on the same worker, interleaved; time per step from the run row's timestamps as in overhead.py.
No reader follows the streamed run: this is what the worker pays.
"""

from __future__ import annotations

import json
import time
import uuid

import redis

from bench.agents import WORDS
from bench.env import BenchEnv
from bench.floor import chains_done, start_stream_hop
from bench.rig import Rig
from bench.stats import Row, Section, interleave, median, paired_ratios, percentile, wait_until
from orchestrator.reader import delays
from orchestrator.status import RunStatus
from orchestrator.testing.script import ScriptConfig

#: The scripted server's answer: 21 words, each its own chunk.
ANSWER = "Here is the answer, written a word at a time as a model streams it to whoever is reading the run."


def measure(rig: Rig, env: BenchEnv, *, runs: int, rounds: int, batches: int) -> list[Section]:
    """Both figures on one rig: TTFT over `runs` runs a producer, and the cost per step over
    `rounds` pairs of runs of `batches` tool batches."""
    return [ttft(rig, env, runs=runs), step_cost(rig, env, rounds=rounds, batches=batches)]


def ttft(rig: Rig, env: BenchEnv, *, runs: int) -> Section:
    """Time to the first delta: Ratchet's reader, the floor by XREAD, the floor polled; `runs` each."""
    rig.server.configure(ScriptConfig(tool_batches=0, final_text=ANSWER))
    r = redis.Redis.from_url(env.redis_url)
    # Where the time goes, in ms after the start on the wall clock (one machine): when the model
    # request reached the server (its request log) and when the worker wrote the first delta.
    marks: dict[str, list[float]] = {f"{side}_{m}": [] for side in ("ratchet", "floor") for m in ("request", "written")}

    def mark(side: str, run_id: str, wall: float, written: float) -> None:
        marks[f"{side}_request"].append((rig.server.requests_for(run_id)[0]["at"] - wall) * 1000)
        marks[f"{side}_written"].append((written - wall) * 1000)

    def ratchet_once() -> float:
        t0, wall = time.perf_counter(), time.time()
        handle = rig.client.start("bench-chat", input="hello", stream=True, run_id=env.queue(uuid.uuid4().hex))
        first = next((e for e in rig.client.stream(handle.run_id, timeout=30) if e.event == "RunContent"), None)
        elapsed = time.perf_counter() - t0
        out = handle.wait(timeout=30)
        assert first is not None and out.status == RunStatus.COMPLETED, out.error
        mark("ratchet", handle.run_id, wall, first.created_at)
        return elapsed * 1000

    def floor_once(blocking: bool) -> float:
        run_id = uuid.uuid4().hex
        key = env.queue(f"ttft.{run_id}")
        t0, wall = time.perf_counter(), time.time()
        start_stream_hop(rig.floor_engine, rig.floor_app, run_id, rig.floor_queue, rig.server.url, key)
        waits = delays()
        while not (got := r.xread({key: "0-0"}, count=1, block=1000) if blocking else r.xrange(key, count=1)):
            if not blocking:
                time.sleep(next(waits))
            assert time.perf_counter() - t0 < 30, "the floor's first delta never came"
        elapsed = time.perf_counter() - t0
        if blocking:
            mark("floor", run_id, wall, json.loads(got[0][1][0][1][b"d"])["t"])
        wait_until(lambda: chains_done(rig.floor_engine, [run_id]), 30, what="the floor hop", interval=0.002)
        return elapsed * 1000

    for _ in range(5):  # warm-up: connections, the openai client, compiled statements
        ratchet_once(), floor_once(True), floor_once(False)
    for values in marks.values():
        values.clear()
    # Two passes of pairs (A B A B), not one cycle of three: in a cycle, each Ratchet run came two
    # floor runs after its worker's last, the floor's worker one run after its own (and its code
    # warm), which put 0.2 ms on Ratchet's side and the ratio at 1.46x where pairs gave 1.26x
    # (bench/FINDINGS.md).
    floor, ratchet = interleave(runs, lambda: floor_once(True), ratchet_once)
    first_pass = {k: list(v) for k, v in marks.items()}  # where the headline's time goes
    polled, beside_polled = interleave(runs, lambda: floor_once(False), ratchet_once)
    r.close()
    return _ttft_section(rig, runs, (floor, ratchet), (polled, beside_polled), first_pass)


def _ttft_section(
    rig: Rig,
    runs: int,
    pair: tuple[list[float], list[float]],
    polled_pair: tuple[list[float], list[float]],
    marks: dict[str, list[float]],
) -> Section:
    """`pair`: the floor's and Ratchet's samples, interleaved; `polled_pair`: the polled floor's
    and Ratchet's, interleaved in a pass of their own."""
    db, name = rig.db, rig.name
    (floor, ratchet), (polled, beside_polled) = pair, polled_pair
    ratio, polled_ratio = median(ratchet) / median(floor), median(beside_polled) / median(polled)
    request_ratio = median(marks["ratchet_request"]) / median(marks["floor_request"])
    written_ratio = median(marks["ratchet_written"]) / median(marks["floor_written"])
    setup = f"{rig.setup}, openai client streaming from the scripted HTTP server, {runs} runs"
    rows = [
        Row(f"Floor: enqueue -> 1 hop streams (openai client) -> first delta by XREAD ({db})", setup, floor, "ms",
            digits=1),
        Row(f"Floor, polled: the same, its stream read on Client.stream's schedule ({db})", setup, polled, "ms",
            digits=1),
        Row(f"Ratchet: start(stream=True) -> first RunContent from Client.stream ({db})", setup, ratchet, "ms",
            ratio=ratio, ratio_note="vs floor (medians)", target="≤ 1.3x the floor", met=ratio <= 1.3, digits=1),
        Row(f"Ratchet: the same beside the polled floor ({db})", setup, beside_polled, "ms", ratio=polled_ratio,
            ratio_note="vs polled floor (medians): Ratchet without its reader's polling", digits=1),
        Row(f"Ratchet: p99 of the same ({db})", setup, [percentile(ratchet, 99)], "ms",
            ratio=percentile(ratchet, 99) / percentile(floor, 99), ratio_note="vs floor p99", digits=1),
        Row(f"Floor: enqueue -> its model request reaches the server ({db})", setup, marks["floor_request"], "ms",
            digits=1),
        Row(f"Ratchet: start -> its model request reaches the server ({db})", setup, marks["ratchet_request"], "ms",
            ratio=request_ratio, ratio_note="vs floor (medians): the way to the model call", digits=1),
        Row(f"Floor: enqueue -> its hop writes the first delta ({db})", setup, marks["floor_written"], "ms", digits=1),
        Row(f"Ratchet: start -> its worker writes the first delta ({db})", setup, marks["ratchet_written"], "ms",
            ratio=written_ratio, ratio_note="vs floor (medians): the worker's side, no reader in it", digits=1),
    ]  # fmt: skip
    section = Section(f"Time to the first streamed token on {name}", rows=rows)
    section.numbers.update({
        f"ttft_ratio_{db}": ratio, f"ttft_ms_median_{db}": median(ratchet),
        f"ttft_ms_p99_{db}": percentile(ratchet, 99), f"ttft_floor_ms_median_{db}": median(floor),
        f"ttft_polled_floor_ms_median_{db}": median(polled), f"ttft_polled_ratio_{db}": polled_ratio,
        f"ttft_request_ms_median_{db}": median(marks["ratchet_request"]),
        f"ttft_floor_request_ms_median_{db}": median(marks["floor_request"]), f"ttft_request_ratio_{db}": request_ratio,
        f"ttft_written_ms_median_{db}": median(marks["ratchet_written"]),
        f"ttft_floor_written_ms_median_{db}": median(marks["floor_written"]), f"ttft_written_ratio_{db}": written_ratio,
    })  # fmt: skip
    return section


def step_cost(rig: Rig, env: BenchEnv, *, rounds: int, batches: int) -> Section:
    """Time per step of a streamed run against the same run not streamed, `rounds` pairs."""
    steps, deltas = 2 * batches + 1, (batches + 1) * len(WORDS)

    def run_once(stream: bool) -> float:
        handle = rig.client.start(
            "bench-talk", input=f"batches={batches}", stream=stream, run_id=env.queue(uuid.uuid4().hex)
        )
        record = wait_until(
            lambda: (r := rig.store.get_record(handle.run_id)).status.is_final and r, 120, what="the run"
        )
        assert record.status == RunStatus.COMPLETED and record.seq == steps, record
        published, _ = rig.client.delta_sink.read(handle.run_id, None)
        assert len(published) == (deltas if stream else 0), (stream, len(published))
        return (record.updated_at - record.created_at) / steps * 1000

    run_once(False), run_once(True)  # warm-up
    plain, streamed = interleave(rounds, lambda: run_once(False), lambda: run_once(True))
    ratio = median(paired_ratios(streamed, plain))
    # What one delta costs the worker: the extra time of a round's streamed run over its deltas.
    per_delta = [(s - p) * steps / deltas for s, p in zip(streamed, plain, strict=True)]
    db, name = rig.db, rig.name
    setup = f"{rig.setup}, one run of {steps} steps, {len(WORDS)} words a model step"
    rows = [
        Row(f"Ratchet: time per step, not streamed ({db})", setup, plain, "ms", digits=3),
        Row(f"Ratchet: time per step, streamed, a delta a word ({db})", setup, streamed, "ms", ratio=ratio,
            ratio_note="vs not streamed", target="≤ 1.2x", met=ratio <= 1.2, digits=3),
        Row(f"Ratchet: what one delta costs the worker ({db})", setup, per_delta, "ms", digits=3),
    ]  # fmt: skip
    section = Section(f"Cost of a streamed step on {name}", rows=rows)
    section.numbers.update({
        f"stream_step_ratio_{db}": ratio, f"stream_step_ms_{db}": median(streamed),
        f"stream_plain_step_ms_{db}": median(plain), f"stream_delta_ms_{db}": median(per_delta),
    })  # fmt: skip
    return section
