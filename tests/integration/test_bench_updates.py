"""`python -m bench.updates` runs alone on a few short runs and merges its figures into an existing
results.json: WAL per step and per renewal on the schema before 0015 and at the head."""

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


@pytest.mark.timeout(200)
def test_the_run_row_benchmark_runs_alone_and_merges_its_figures_into_the_results(
    tmp_path: Path, redis_url: str
) -> None:
    shutil.copy(ROOT / "bench" / "results.json", tmp_path / "results.json")  # left alone: a copy
    before = json.loads((tmp_path / "results.json").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env["PYTHONPATH"] = str(ROOT)

    argv = ["--runs", "3", "--batches", "2", "--rounds", "1", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.updates", *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )

    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for key in ("updates_wal", "updates_wal_floor", "updates_index_wal", "updates_renewal_wal", "updates_ms_ratio"):
        assert isinstance(results.get(key), (int, float)) and math.isfinite(results[key]) and results[key] > 0, key
    assert 0 <= results["updates_hot_share"] <= 100
    assert results["per_step_ratio_pg"] == before["per_step_ratio_pg"]  # the other figures are kept
    assert "WAL per step, head" in (tmp_path / "RESULTS.md").read_text()
