"""`python -m bench [--quick | --smoke] [--out DIR] [--only ITEMS]`: run the benchmarks, write RESULTS.md
and results.json (see bench/README.md for how to read them)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bench import (
    ceiling,
    concurrency,
    decision,
    flatness,
    history,
    latency,
    listing,
    mcp_call,
    memory,
    overhead,
    page,
    providers,
    recovery,
    scaling,
    streaming,
    updates,
)
from bench.env import DATABASES, BenchEnv, bench_env
from bench.procs import stop_all
from bench.report import NOT_QUICK, REQUIRED, render, write
from bench.rig import Rig, spawn_rig
from bench.stats import Section
from orchestrator.testing.server import ScriptedServer

HERE = Path(__file__).resolve().parent
ITEMS = tuple(
    "overhead latency flat stream history decision updates io scale ceiling recovery memory listing page "
    "providers mcp".split()
)
#: The items measured on the rig of each database (its workers started once for all of them).
RIG_ITEMS = {"overhead", "latency", "flat", "stream", "history", "decision"}


@dataclass(frozen=True)
class Sizes:
    """How much each benchmark runs: its rounds, runs and their lengths (see each module)."""

    overhead_rounds: int
    latency_runs: int
    flat_rounds: int
    flat_far: int
    stream_runs: int
    stream_rounds: int
    stream_batches: int
    history_rounds: int
    decision_rounds: int
    updates_runs: int
    updates_batches: int
    updates_rounds: int
    io_threads: int
    io_more_threads: tuple[int, ...]
    io_runs: int
    io_rounds: int
    scale_threads: int
    scale_runs_per_slot: int
    scale_passes: int
    ceiling_runs: int
    ceiling_rounds: int
    ceiling_configs: tuple[tuple[str, int], ...]
    recovery_rounds: int
    recovery_default_rounds: int
    memory_runs: int
    listing_runs: int
    listing_rounds: int
    page_rounds: int
    page_batches: int
    providers_rounds: int
    providers_calls: int
    mcp_rounds: int
    mcp_calls: int


#: `python -m bench`: the figures RESULTS.md stores.
FULL = Sizes(
    overhead_rounds=15, latency_runs=200, flat_rounds=5, flat_far=1000, stream_runs=200, stream_rounds=15,
    stream_batches=100, history_rounds=200, decision_rounds=30, updates_runs=30, updates_batches=10, updates_rounds=3,
    io_threads=50, io_more_threads=(100, 200), io_runs=1000, io_rounds=2,
    scale_threads=scaling.PER_PROCESS, scale_runs_per_slot=10, scale_passes=2,
    ceiling_runs=1000, ceiling_rounds=ceiling.ROUNDS, ceiling_configs=ceiling.CONFIGS,
    recovery_rounds=3, recovery_default_rounds=2, memory_runs=10_000, listing_runs=1_000_000, listing_rounds=60,
    page_rounds=15, page_batches=333, providers_rounds=31, providers_calls=50,
    mcp_rounds=15, mcp_calls=200,
)  # fmt: skip
#: `--quick`: a figure of each in a few minutes (no run with the default recovery settings:
#: tests/chaos/test_default_recovery.py shows it).
QUICK = Sizes(
    overhead_rounds=2, latency_runs=20, flat_rounds=1, flat_far=200, stream_runs=20, stream_rounds=1,
    stream_batches=20, history_rounds=20, decision_rounds=5, updates_runs=4, updates_batches=3, updates_rounds=1,
    io_threads=20, io_more_threads=(), io_runs=40, io_rounds=1,
    scale_threads=2, scale_runs_per_slot=4, scale_passes=1,
    ceiling_runs=100, ceiling_rounds=1, ceiling_configs=(("threads", 50),),
    recovery_rounds=1, recovery_default_rounds=0, memory_runs=200, listing_runs=20_000, listing_rounds=20,
    page_rounds=2, page_batches=20, providers_rounds=2, providers_calls=20,
    mcp_rounds=3, mcp_calls=50,
)  # fmt: skip
#: `--smoke`: one sample of each figure from the shortest runs that write it, every worker process
#: and page of a full run started (tests/integration/test_bench_smoke.py: the benchmarks run and
#: report; their figures mean nothing). The flatness run's farthest window starts past the
#: window at step 100 (plus its own length, bench.flatness.WINDOW).
SMOKE = replace(
    QUICK, overhead_rounds=1, latency_runs=2, flat_far=100 + 2 * flatness.WINDOW, stream_runs=2, stream_batches=3,
    history_rounds=2, decision_rounds=1, updates_runs=3, updates_batches=2, io_threads=4, io_runs=8,
    scale_threads=1, scale_runs_per_slot=1, ceiling_runs=10, ceiling_configs=(("threads", 5),),
    memory_runs=memory.BATCH, listing_runs=3000, listing_rounds=3, page_rounds=1, page_batches=3,
    providers_rounds=1, providers_calls=3, mcp_rounds=1, mcp_calls=5,
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a one-minute version (fewer rounds, shorter runs)")
    parser.add_argument(
        "--smoke", action="store_true", help="the smallest run that writes every figure (a quick run, for the tests)"
    )
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
    q = args.quick or args.smoke
    sizes = SMOKE if args.smoke else QUICK if q else FULL
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
        _measure(env, server, only, sizes, run)
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


def _measure(env: BenchEnv, server: ScriptedServer, only: set[str], z: Sizes, run: Callable[..., None]) -> None:
    """Every benchmark in `only`, each through `run` (which prints and collects its sections)."""
    if only & RIG_ITEMS:
        rigs: dict[str, Rig] = {db: spawn_rig(env, db, server) for db in DATABASES}
        try:
            for rig in rigs.values():
                for w in rig.workers:
                    w.wait_ready()
            for db, rig in rigs.items():
                if "overhead" in only:
                    run(
                        f"per-step overhead ({db})",
                        lambda rig=rig: overhead.measure(rig, env, rounds=z.overhead_rounds),
                    )
                if "latency" in only:
                    run(f"end-to-end latency ({db})", lambda rig=rig: latency.measure(rig, runs=z.latency_runs))
                if "flat" in only:
                    run(
                        f"flatness ({db})",
                        lambda rig=rig: flatness.measure(rig, env, rounds=z.flat_rounds, far=z.flat_far),
                    )
                if "stream" in only:
                    run(f"streaming ({db})", lambda rig=rig: streaming.measure(
                        rig, env, runs=z.stream_runs, rounds=z.stream_rounds, batches=z.stream_batches))  # fmt: skip
                if "history" in only:
                    run(f"session history ({db})", lambda rig=rig: history.measure(rig, rounds=z.history_rounds))
                if "decision" in only:
                    run(f"a decision ({db})", lambda rig=rig: decision.measure(rig, rounds=z.decision_rounds))
        finally:
            stop_all([w for rig in rigs.values() for w in rig.workers])  # at once, not rig by rig
            for rig in rigs.values():
                rig.close()
    if "updates" in only:
        sized = {"runs": z.updates_runs, "batches": z.updates_batches, "rounds": z.updates_rounds}
        run("run-row updates", lambda: updates.measure(env, **sized))
    if "io" in only:
        run("I/O-bound concurrency", lambda: _concurrency(env, z))
    if "scale" in only:
        sized = {"per_process": z.scale_threads, "runs_per_slot": z.scale_runs_per_slot, "passes": z.scale_passes}
        run("scaling with worker processes", lambda: scaling.measure(env, **sized))
    if "ceiling" in only:
        run(
            "concurrent runs on one worker host",
            lambda: ceiling.measure(env, n_runs=z.ceiling_runs, rounds=z.ceiling_rounds, configs=z.ceiling_configs),
        )
    if "recovery" in only:
        run(
            "recovery",
            lambda: recovery.measure(env, rounds=z.recovery_rounds, default_rounds=z.recovery_default_rounds),
        )
    if "memory" in only:
        run("worker memory", lambda: memory.measure(env, total=z.memory_runs))
    if "listing" in only:
        run("listing runs", lambda: listing.measure(env, runs=z.listing_runs, rounds=z.listing_rounds))
    if "page" in only:
        run("run page in Chromium", lambda: page.measure(env, rounds=z.page_rounds, batches=z.page_batches))
    if "providers" in only:
        run("provider adapters", lambda: providers.measure(rounds=z.providers_rounds, calls=z.providers_calls))
    if "mcp" in only:
        run("an MCP tool call", lambda: mcp_call.measure(rounds=z.mcp_rounds, calls=z.mcp_calls))


#: The item that writes each headline figure: the one whose longest prefix the figure's name starts with.
PREFIXES = {
    "overhead": ("per",), "latency": ("e2e",), "flat": ("flat",), "stream": ("ttft", "stream"),
    "history": ("history",), "decision": ("decision", "paused"), "updates": ("updates",), "io": ("concurrency",),
    "scale": ("scale", "floor_scale"), "ceiling": ("concurrency_ratio_1000",),
    "recovery": ("recovery",), "listing": ("listing",), "page": ("page",), "providers": ("provider",), "mcp": ("mcp",),
}  # fmt: skip


def _item_of(key: str) -> str | None:
    matches = [(len(p), item) for item, ps in PREFIXES.items() for p in ps if key.startswith(p)]
    return max(matches)[1] if matches else None


def _concurrency(env: BenchEnv, z: Sizes) -> list[Section]:
    """The I/O-bound runs at `z.io_threads`, then at each of `z.io_more_threads` (the concurrency
    benchmark runs its own scripted server, with the 0.5 s delay)."""
    main_c = z.io_threads
    section, figures = concurrency.measure(
        env, n_runs=z.io_runs, rounds=z.io_rounds, pool="threads", concurrency=main_c
    )
    section.numbers.update(
        concurrency_ratio=figures["ratio"], concurrency_steps_per_s=figures["ratchet"],
        concurrency_floor_steps_per_s=figures["floor"], concurrency_threads=float(main_c),
    )  # fmt: skip
    sections = [section]
    for c in z.io_more_threads:
        more, figs = concurrency.measure(env, n_runs=z.io_runs, rounds=1, pool="threads", concurrency=c)
        more.numbers[f"concurrency_ratio_c{c}"] = figs["ratio"]
        more.numbers[f"concurrency_steps_per_s_c{c}"] = figs["ratchet"]
        sections.append(more)
    return sections


if __name__ == "__main__":
    sys.exit(main())
