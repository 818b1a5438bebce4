"""`python -m bench.page` runs alone, on a short run (the benchmark's 1,001 messages are its own
business), and merges its figures into an existing results.json."""

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


def test_the_page_benchmark_runs_alone_and_merges_its_figures_into_the_results(tmp_path: Path, redis_url: str) -> None:
    shutil.copy(ROOT / "bench" / "results.json", tmp_path / "results.json")  # left alone: a copy
    before = json.loads((tmp_path / "results.json").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env["PYTHONPATH"] = str(ROOT)

    done = subprocess.run(
        [sys.executable, "-m", "bench.page", "--rounds", "1", "--batches", "3", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert math.isfinite(results["page_load_1000_ms"]) and math.isfinite(results["page_list_ms_sqlite"])
    assert results["listing_ms_pg"] == before["listing_ms_pg"]  # the other figures are kept
    assert "Run page, 11 messages, first load (PostgreSQL)" in (tmp_path / "RESULTS.md").read_text()
