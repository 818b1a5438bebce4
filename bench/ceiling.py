"""Item 9, second part ("ceiling"): 1,000 concurrent runs on one worker host against the Celery I/O
ceiling measured in the same run.

1,000 runs start at once (model call -> tool batch -> model call, the model answering after
0.5 s, as in the I/O-bound concurrency section) on one host's workers: two processes, one per
core, each consuming all of its side's queues. Ratchet and the floor (bare Celery chains of the
same shape, their model hops calling through the openai client) run each pool configuration in
`CONFIGS`, interleaved round by round. Two processes of 500 threads or greenlets hold all 1,000
runs' model calls at once; 2 x 100 threads is what docs/operations.md recommends for threads.

The floor's best configuration (by its median over the rounds) is the ceiling: what Celery alone
gets out of this host for this work. Ratchet's best configuration is measured against it round by
round, round i of one against round i of the other (`concurrency_ratio_1000` is the median of
those ratios, `_min` and `_max` their spread; target ≥ 0.8x), and each configuration against the
floor's same configuration, round by round. Within a configuration the two sides alternate which
goes first. On two cores all of these are CPU-bound (1,000 runs in flight would allow 2,000 model
calls a second), so the ratio says how much CPU a step costs Ratchet against Celery alone; the
CPU per step of each side is reported beside. One round read 0.90x on a quiet machine and 0.70x
on a busier one: the figure needs its rounds (`ROUNDS`), and its spread says how far one moves.

`python -m bench.ceiling [--runs N] [--rounds R] [--out DIR]` runs this part alone and merges its
section into DIR/results.json (bench/ by default).

Ratchet's gevent workers are `ratchet worker -P gevent`, which applies gevent's monkey patches
before anything is imported, as `celery worker -P gevent` does.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import report
from bench.env import BenchEnv, bench_env
from bench.fleet import FloorSide, RatchetSide, Sample, close, describe_cpu, scripted_model
from bench.stats import Row, Section, median, paired_ratios

HERE = Path(__file__).resolve().parent
DELAY_S = 0.5
PROCESSES = 2
TARGET = 0.8
#: Rounds of a full run: each configuration's two sides, `n_runs` runs each, a round.
ROUNDS = 3
#: (pool, concurrency per process) configurations of a full run.
CONFIGS = (("threads", 100), ("threads", 500), ("gevent", 500))


def measure(env: BenchEnv, *, n_runs: int, rounds: int, configs: Sequence[tuple[str, int]] = CONFIGS) -> Section:
    if importlib.util.find_spec("gevent") is None:
        configs = [c for c in configs if c[0] != "gevent"]
    load = os.getloadavg()[0]
    results: dict[tuple[str, int], tuple[list[Sample], list[Sample]]] = {}
    with scripted_model(DELAY_S) as (model_url, model_pid):
        for i, (pool, c) in enumerate(configs):
            results[(pool, c)] = _config(env, model_url, model_pid, pool, c, n_runs, rounds, tag=str(i))
    return _section(results, n_runs, load, os.getloadavg()[0])


def _config(
    env: BenchEnv, model_url: str, model_pid: int, pool: str, c: int, n_runs: int, rounds: int, tag: str
) -> tuple[list[Sample], list[Sample]]:
    """Both sides' two processes with this pool, started and warmed up; `rounds` interleaved."""
    url = env.db_url("pg")
    ratchet = RatchetSide(env, env.settings(url, f"ceiling-{tag}"), model_url)
    floor = FloorSide(env, url, model_url, f"ceiling-floor-{tag}", side=False)
    for _ in range(PROCESSES):
        ratchet.add(pool, c)
        floor.add(pool, c)
    r: list[Sample] = []
    f: list[Sample] = []
    try:
        ratchet.spawn()
        floor.spawn()
        ratchet.wait_ready()
        floor.wait_ready()
        # Warm-up. The floor's threads each keep an openai client of their own, built on a
        # thread's first hop: as many runs as threads. On gevent, and in Ratchet's workers, a
        # process shares one.
        floor.throughput(min(n_runs, PROCESSES * c if pool == "threads" else 200))
        ratchet.throughput(min(n_runs, 200))
        for i in range(rounds):  # the sides alternate which goes first: the machine's drift evens out
            if i % 2 == 0:
                f.append(floor.measure(n_runs, model_pid))
                r.append(ratchet.measure(n_runs, model_pid))
            else:
                r.append(ratchet.measure(n_runs, model_pid))
                f.append(floor.measure(n_runs, model_pid))
    finally:
        close(ratchet, floor)
    return r, f


def _section(
    results: dict[tuple[str, int], tuple[list[Sample], list[Sample]]], n_runs: int, load0: float, load1: float
) -> Section:
    rows: list[Row] = []
    numbers: dict[str, float] = {"ceiling_loadavg": (load0 + load1) / 2, "ceiling_runs": float(n_runs)}
    best_r: tuple[float, str, tuple[str, int]] = (0.0, "", ("", 0))  # median steps/s, name, configuration
    best_f: tuple[float, str, tuple[str, int]] = (0.0, "", ("", 0))
    for (pool, c), (r_samples, f_samples) in results.items():
        r, f = [s.steps_per_s for s in r_samples], [s.steps_per_s for s in f_samples]
        name = f"{PROCESSES} x -P {pool} -c {c}"
        setup = f"PostgreSQL, {n_runs} runs at once, model calls {DELAY_S} s, {name}"
        rows.append(Row(f"Floor: steps/s ({name})", f"{setup}; {describe_cpu(f_samples)}", f, "steps/s", digits=1))
        rows.append(Row(f"Ratchet: steps/s ({name})", f"{setup}; {describe_cpu(r_samples)}", r, "steps/s",
                        ratio=median(paired_ratios(r, f)), ratio_note="of floor, same pool", digits=1))  # fmt: skip
        key = f"{pool}_c{c}"
        numbers[f"ceiling_steps_per_s_{key}"], numbers[f"ceiling_floor_steps_per_s_{key}"] = median(r), median(f)
        numbers[f"ceiling_cpu_ms_{key}"] = median([s.cpu_ms_per_step for s in r_samples])
        numbers[f"ceiling_floor_cpu_ms_{key}"] = median([s.cpu_ms_per_step for s in f_samples])
        best_r, best_f = max(best_r, (median(r), name, (pool, c))), max(best_f, (median(f), name, (pool, c)))
    ratios = paired_ratios(
        [s.steps_per_s for s in results[best_r[2]][0]], [s.steps_per_s for s in results[best_f[2]][1]]
    )
    ratio = median(ratios)
    numbers.update(
        concurrency_ratio_1000=ratio, concurrency_ratio_1000_min=min(ratios), concurrency_ratio_1000_max=max(ratios),
        ceiling_rounds=float(len(ratios)), ceiling_steps_per_s=best_f[0], ceiling_ratchet_steps_per_s=best_r[0],
    )  # fmt: skip
    setup = f"Ratchet {best_r[1]} (median {best_r[0]:.1f} steps/s); floor {best_f[1]} (median {best_f[0]:.1f})"
    what = "Ratchet's best against the ceiling (the floor's best), round by round"
    target = f"≥ {TARGET:.2f}x"
    rows.append(
        Row(what, setup, ratios, "x", ratio=ratio, ratio_note="of the ceiling", target=target, met=ratio >= TARGET)
    )
    notes = [f"Load average {load0:.1f} at the start, {load1:.1f} at the end (2 cores)."]
    return Section(f"{n_runs} concurrent runs on one worker host", rows=rows, numbers=numbers, notes=notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ceiling", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs started at once (default 1,000)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds of each configuration (default {ROUNDS})")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json and RESULTS.md are")
    args = parser.parse_args(argv)
    began = time.monotonic()
    with bench_env() as env:
        section = measure(env, n_runs=args.runs, rounds=args.rounds)
    section.seconds = time.monotonic() - began
    for row in section.rows:
        print("  " + " | ".join(row.cells()), file=sys.stderr)
    print(section.notes[0], file=sys.stderr)
    report.merge(args.out, section, replaces=lambda title: title.endswith("concurrent runs on one worker host"))
    return 0 if math.isfinite(section.numbers.get("concurrency_ratio_1000", math.nan)) else 1


if __name__ == "__main__":
    sys.exit(main())
