"""Items 1 and 2: the floor, and Ratchet's cost per step against it.

Per round, on one database: a floor chain of N hops and a Ratchet run of N steps (the scripted
model's 100 tool-calling turns, their 100 tool batches, the final answer), one after the other,
each on its own worker subprocess (threads pool, 4 threads) consuming real Redis. Time per step
is taken from the database's own timestamps (the run row's created_at to its last update), so
the producer's polling does not enter it. Ratios are per round (each run against the floor next
to it), then the median.
"""

from __future__ import annotations

import uuid

from bench.env import BenchEnv
from bench.floor import chains_done, raw_tx_ms, redis_hop_ms, start_chain
from bench.rig import Rig
from bench.stats import Row, Section, interleave, median, paired_ratios, wait_until
from orchestrator.status import RunStatus

STEPS = 201  # 100 model calls with a tool call, 100 tool batches, the final model call


def measure(rig: Rig, env: BenchEnv, *, rounds: int) -> Section:
    def floor_round() -> float:
        run_id = uuid.uuid4().hex
        start_chain(rig.floor_engine, rig.floor_app, run_id, STEPS, rig.floor_queue)
        ((created, updated),) = wait_until(lambda: chains_done(rig.floor_engine, [run_id]), 120, what="the floor chain")
        return (updated - created) / STEPS * 1000

    def ratchet_round() -> float:
        handle = rig.client.start("bench-steps", input="go")
        record = wait_until(
            lambda: (r := rig.store.get_record(handle.run_id)).status.is_final and r, 120, what="the ratchet run"
        )
        assert record.status == RunStatus.COMPLETED and record.seq == STEPS, record
        return (record.updated_at - record.created_at) / record.seq * 1000

    floor_round(), ratchet_round()  # warm-up: imports, connections, first compilations
    floor, ratchet = interleave(rounds, floor_round, ratchet_round)
    hop = [redis_hop_ms(env.redis_url, env.queue("raw"), 500) for _ in range(rounds)]
    tx = [raw_tx_ms(rig.url, 200) for _ in range(rounds)]
    return _section(rig, floor, ratchet, hop, tx)


def _section(rig: Rig, floor: list[float], ratchet: list[float], hop: list[float], tx: list[float]) -> Section:
    db, name = rig.db, rig.name
    ratios = paired_ratios(ratchet, floor)
    physical = [h + t for h, t in zip(hop, tx, strict=True)]
    setup = rig.setup
    rows = [
        Row("Physical limit: bare Redis hop (LPUSH+BRPOP)", "redis-py, 2 connections", hop, "ms", digits=3),
        Row(f"Physical limit: raw-driver transaction ({db})", f"{name}, INSERT+UPDATE+COMMIT", tx, "ms", digits=3),
        Row(f"Floor: Celery chain hop + 1 SQLAlchemy tx ({db})", setup + f", {STEPS} hops", floor, "ms",
            ratio=median(paired_ratios(floor, physical)), ratio_note="vs Redis hop + raw tx", digits=3),
        Row(f"Ratchet: time per step ({db})", setup + f", one run of {STEPS} steps", ratchet, "ms",
            ratio=median(ratios), ratio_note="vs floor", target="≤ 1.3x", met=median(ratios) <= 1.3, digits=3),
    ]  # fmt: skip
    section = Section(f"Per-step overhead on {name}", rows=rows)
    section.numbers[f"per_step_ratio_{db}"] = median(ratios)
    section.numbers[f"per_step_ms_{db}"] = median(ratchet)
    section.numbers[f"floor_step_ms_{db}"] = median(floor)
    section.numbers[f"celery_hop_vs_physical_{db}"] = median(paired_ratios(floor, physical))
    return section
