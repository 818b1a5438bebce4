"""The benchmarks run: `python -m bench --smoke`, the shortest run of each (every worker process,
database and page of a full run, one round of the fewest runs), writes every headline figure a
quick run writes.

Benchmarks are not tests (`make test` does not run them); this only checks that they still run
and report, into a temporary folder so bench/RESULTS.md is left alone. Their figures, from so few
samples, mean nothing: `make bench-quick` and `make bench` measure."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import ITEMS, NOT_QUICK, REQUIRED, _item_of

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


#: The benchmark in parts (their items, for `--only`), one test each so that a parallel run spreads
#: them: the items that share one rig of workers and a database (bench/rig.py), started once for all
#: of them (alone, each item would start its own: 111 s for five of them, 49 s together), then the
#: others, a few to a part of about half a minute at most. Each part is a process of the benchmark,
#: whose start (its imports, databases and scripted model) cost 2-3 CPU-s: on a quiet machine the
#: ten other items one to a process took 98 CPU-s and 114 s, in the four parts here 79 CPU-s and 90 s.
RIGS = "overhead,latency,flat,stream,history,decision"
OTHERS = ("scale", "ceiling,recovery", "io,providers,page", "updates,listing,mcp,memory")
PARTS = {"rigs": RIGS} | {only: only for only in OTHERS}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("part", list(PARTS))
def test_the_benchmark_writes_every_headline_figure_as_a_finite_number(
    tmp_path: Path, redis_url: str, part: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env["PYTHONPATH"] = str(ROOT)
    only = PARTS[part]

    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--only", only, "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for key in (k for k in REQUIRED if k not in NOT_QUICK and _item_of(k) in only.split(",")):
        assert isinstance(results.get(key), (int, float)) and math.isfinite(results[key]), (key, results.get(key))
    assert results["meta"]["quick"] is True
    table = (tmp_path / "RESULTS.md").read_text()
    assert "| what | setup | median | min-max | rounds | ratio |" in table


def test_the_parts_cover_every_benchmark_and_every_headline_figure() -> None:
    items = [item for only in PARTS.values() for item in only.split(",")]
    assert sorted(items) == sorted(ITEMS)  # each once
    assert {_item_of(k) for k in REQUIRED} <= set(items)  # every headline figure is some part's
