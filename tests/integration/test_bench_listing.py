"""`python -m bench.listing` runs alone on a few thousand runs (the benchmark's million is not a
test) and merges its figures and the query's plan into an existing results.json."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def test_the_listing_benchmark_runs_alone_and_merges_its_figures_and_plan_into_the_results(
    tmp_path: Path, redis_url: str
) -> None:
    shutil.copy(ROOT / "bench" / "results.json", tmp_path / "results.json")  # left alone: a copy
    before = json.loads((tmp_path / "results.json").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env["PYTHONPATH"] = str(ROOT)

    done = subprocess.run(
        [sys.executable, "-m", "bench.listing", "--runs", "3000", "--rounds", "3", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert math.isfinite(results["listing_ms_pg"]) and results["listing_runs"] == 3000
    assert results["per_step_ratio_pg"] == before["per_step_ratio_pg"]  # the other figures are kept
    (section,) = [s for s in results["sections"] if s["title"].startswith("Listing runs out of")]
    assert "ix_ratchet_runs_agent_listing" in section["notes"][0]
    assert "List runs: status and agent, first page" in (tmp_path / "RESULTS.md").read_text()
