"""`python -m bench.compare BASE CANDIDATE [--rounds N] [--only ITEMS] [--full] [--out DIR]`: the
per-step and end-to-end figures of two checkouts, measured side by side.

Each round runs `python -m bench --quick --only ITEMS` (without `--quick` with `--full`) once in
each checkout, from its own folder and with its own code on PYTHONPATH (its workers import it
too), the two in turn and which goes first alternating, so that the machine's load meets both
alike. Then, for each figure, the median over rounds on each side and the candidate's over the
base's: above 1.05 on a ratio to a floor (`*_ratio_*`) is slower than the issue allows. The
rounds' results.json stay in DIR (default: a temporary folder) for a closer look.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.stats import median

#: The figures compared: time per step and end to end, as ratios to their floors and absolute.
FIGURES = (
    "per_step_ratio_pg", "per_step_ratio_sqlite", "e2e_ratio_pg", "e2e_ratio_sqlite",
    "per_step_ms_pg", "per_step_ms_sqlite", "e2e_ms_median_pg", "e2e_ms_median_sqlite",
)  # fmt: skip
ALLOWED = 1.05
TRIES = 3


def run(checkout: Path, out: Path, only: str, full: bool) -> dict[str, float]:
    """One run of the benchmarks `only` in `checkout`; its figures. A run that fails is tried
    again, up to `TRIES` times: on a loaded machine a worker can miss its minute to get ready."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env["PYTHONPATH"] = str(checkout)
    argv = [sys.executable, "-m", "bench", *([] if full else ["--quick"]), "--only", only, "--out", str(out)]
    for attempt in range(1, TRIES + 1):
        if subprocess.run(argv, cwd=checkout, env=env).returncode == 0:
            break
        if attempt == TRIES:
            raise SystemExit(f"compare: {' '.join(argv)} failed {TRIES} times in {checkout}")
        print(f"compare: the run failed; again ({attempt + 1} of {TRIES})", file=sys.stderr, flush=True)
    data = json.loads((out / "results.json").read_text())
    return {k: float(data[k]) for k in FIGURES if isinstance(data.get(k), (int, float))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the checkout measured against (e.g. a worktree of the base commit)")
    parser.add_argument("candidate", type=Path, help="the checkout measured")
    parser.add_argument("--rounds", type=int, default=3, help="runs in each checkout, in turn")
    parser.add_argument("--only", default="overhead,latency", help="the benchmarks run (python -m bench --only)")
    parser.add_argument("--full", action="store_true", help="the full benchmarks, not --quick")
    parser.add_argument("--out", type=Path, default=None, help="where each run's results.json stays")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="ratchet-compare-"))
    sides = {"base": args.base.resolve(), "candidate": args.candidate.resolve()}
    figures: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for i in range(args.rounds):
        for side in list(sides) if i % 2 == 0 else list(sides)[::-1]:
            print(f"compare: round {i + 1}, {side} ({sides[side]})", file=sys.stderr, flush=True)
            figures[side].append(run(sides[side], out / f"{side}-{i + 1}", args.only, args.full))
    print(f"{'figure':24} {'base':>9} {'candidate':>9} {'cand/base':>9}   (medians of {args.rounds} rounds; {out})")
    slower = []
    for key in FIGURES:
        base, cand = (median([f[key] for f in figures[s] if key in f]) for s in sides)
        change = cand / base if base else float("nan")
        flag = " slower" if "_ratio_" in key and change > ALLOWED else ""
        slower += [key] if flag else []
        print(f"{key:24} {base:9.3f} {cand:9.3f} {change:9.3f}{flag}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
