"""`python -m bench [--quick] [--out DIR] [--only ITEMS]`: run the benchmarks, write RESULTS.md
and results.json (see bench/README.md for how to read them)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import (
    ceiling,
    concurrency,
    flatness,
    history,
    latency,
    listing,
    memory,
    overhead,
    page,
    recovery,
    scaling,
    streaming,
    updates,
)
from bench.env import DATABASES, BenchEnv, bench_env
from bench.report import NOT_QUICK, REQUIRED, render, write
from bench.rig import Rig, spawn_rig
from bench.stats import Section
from orchestrator.testing.server import ScriptedServer

HERE = Path(__file__).resolve().parent
ITEMS = tuple("overhead latency flat stream history updates io scale recovery memory listing page".split())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a one-minute version (fewer rounds, shorter runs)")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write RESULTS.md and results.json")
    parser.add_argument("--only", default=",".join(ITEMS), help=f"comma-separated subset of {','.join(ITEMS)}")
    parser.add_argument("--render", action="store_true", help="only rewrite RESULTS.md from results.json")
    args = parser.parse_args(argv)
    if args.render:
        return render(args.out)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    only = set(args.only.split(","))
    if "page" in only:
        page.require_chromium()  # now, not after the other items' quarter of an hour
    q = args.quick
    t0 = time.monotonic()
    sections: list[Section] = []

    def run(title: str, fn: Callable[[], Section | list[Section]]) -> None:
        started = time.monotonic()
        print(f"bench: {title} ...", file=sys.stderr, flush=True)
        result = fn()
        for s in result if isinstance(result, list) else [result]:
            s.seconds = time.monotonic() - started
            sections.append(s)
            for row in s.rows:
                print("  " + " | ".join(row.cells()), file=sys.stderr, flush=True)

    with bench_env() as env, ScriptedServer() as server:
        _measure(env, server, only, q, run)
    numbers: dict[str, float] = {}
    for s in sections:
        numbers.update(s.numbers)
    elapsed = time.monotonic() - t0
    write(args.out, sections, numbers, quick=q, elapsed=elapsed)
    required = [k for k in REQUIRED if not (q and k in NOT_QUICK)]
    missing = [k for k in required if _item_of(k) in only and not math.isfinite(numbers.get(k, math.nan))]
    print(f"bench: done in {elapsed:.0f} s; wrote {args.out / 'RESULTS.md'} and results.json", file=sys.stderr)
    if missing:
        print(f"bench: missing figures: {missing}", file=sys.stderr)
        return 1
    return 0


def _measure(env: BenchEnv, server: ScriptedServer, only: set[str], q: bool, run: Callable[..., None]) -> None:
    """Every benchmark in `only`, each through `run` (which prints and collects its sections)."""
    if only & {"overhead", "latency", "flat", "stream", "history"}:
        rigs: dict[str, Rig] = {db: spawn_rig(env, db, server) for db in DATABASES}
        try:
            for rig in rigs.values():
                for w in rig.workers:
                    w.wait_ready()
            for db, rig in rigs.items():
                if "overhead" in only:
                    run(
                        f"per-step overhead ({db})",
                        lambda rig=rig: overhead.measure(rig, env, rounds=2 if q else 15),
                    )
                if "latency" in only:
                    run(f"end-to-end latency ({db})", lambda rig=rig: latency.measure(rig, runs=20 if q else 200))
                if "flat" in only:
                    run(f"flatness ({db})", lambda rig=rig: flatness.measure(
                        rig, env, rounds=1 if q else 5, far=200 if q else 1000))  # fmt: skip
                if "stream" in only:
                    run(f"streaming ({db})", lambda rig=rig: streaming.measure(
                        rig, env, runs=20 if q else 200, rounds=1 if q else 15, batches=20 if q else 100))  # fmt: skip
                if "history" in only:
                    run(f"session history ({db})", lambda rig=rig: history.measure(rig, rounds=20 if q else 200))
        finally:
            for rig in rigs.values():
                rig.close()
    if "updates" in only:
        run(
            "run-row updates",
            lambda: updates.measure(env, runs=4 if q else 30, batches=3 if q else 10, rounds=1 if q else 3),
        )
    if "io" in only:
        run("I/O-bound concurrency", lambda: _concurrency(env, server, q))
    if "scale" in only:
        run("scaling with worker processes", lambda: _scale(env, q))
    if "recovery" in only:
        run("recovery", lambda: recovery.measure(env, rounds=1 if q else 3, default_rounds=0 if q else 2))
    if "memory" in only:
        run("worker memory", lambda: memory.measure(env, total=200 if q else 10_000))
    if "listing" in only:
        run("listing runs", lambda: listing.measure(env, runs=20_000 if q else 1_000_000, rounds=20 if q else 60))
    if "page" in only:
        run("run page in Chromium", lambda: page.measure(env, rounds=2 if q else 15, batches=20 if q else 333))


#: The item that writes each headline figure: the one whose longest prefix the figure's name starts with.
PREFIXES = {
    "overhead": ("per",), "latency": ("e2e",), "flat": ("flat",), "stream": ("ttft", "stream"),
    "history": ("history",), "updates": ("updates",), "io": ("concurrency",),
    "scale": ("scale", "floor_scale", "concurrency_ratio_1000"),
    "recovery": ("recovery",), "listing": ("listing",), "page": ("page",),
}  # fmt: skip


def _item_of(key: str) -> str | None:
    matches = [(len(p), item) for item, ps in PREFIXES.items() for p in ps if key.startswith(p)]
    return max(matches)[1] if matches else None


def _scale(env: BenchEnv, quick: bool) -> list[Section]:
    """Throughput with 1, 2 and 4 worker processes, then 1,000 concurrent runs on one host."""
    if quick:
        spread = scaling.measure(env, per_process=2, runs_per_slot=4, passes=1)
        return [spread, ceiling.measure(env, n_runs=100, rounds=1, configs=[("threads", 50)])]
    spread = scaling.measure(env, per_process=scaling.PER_PROCESS, runs_per_slot=10, passes=2)
    return [spread, ceiling.measure(env, n_runs=1000, rounds=ceiling.ROUNDS)]


def _concurrency(env: object, server: ScriptedServer, quick: bool) -> list[Section]:
    del server  # the concurrency benchmark runs its own server, with the 0.5 s delay
    if quick:
        main_c, extra_c, n_runs, rounds = 20, [], 40, 1
    else:
        main_c, extra_c, n_runs, rounds = 50, [100, 200], 1000, 2
    section, figures = concurrency.measure(env, n_runs=n_runs, rounds=rounds, pool="threads", concurrency=main_c)  # type: ignore[arg-type]
    section.numbers.update(
        concurrency_ratio=figures["ratio"], concurrency_steps_per_s=figures["ratchet"],
        concurrency_floor_steps_per_s=figures["floor"], concurrency_threads=float(main_c),
    )  # fmt: skip
    sections = [section]
    for c in extra_c:
        more, figs = concurrency.measure(env, n_runs=n_runs, rounds=1, pool="threads", concurrency=c)  # type: ignore[arg-type]
        more.numbers[f"concurrency_ratio_c{c}"] = figs["ratio"]
        more.numbers[f"concurrency_steps_per_s_c{c}"] = figs["ratchet"]
        sections.append(more)
    return sections


if __name__ == "__main__":
    sys.exit(main())
