"""The benchmarks' bookkeeping: which item owes each headline figure (so `--only` asks only for
the figures it measured), and the CPU meter the scaling benchmark reports beside each figure."""

from __future__ import annotations

import subprocess
import sys

from bench.__main__ import ITEMS, REQUIRED, _item_of
from bench.cpu import CpuMeter

#: A child that burns 0.3 s of CPU, says so, then waits for a line on stdin before it exits.
BURN = "\n".join(
    ["import time", "t = time.process_time()", "while time.process_time() - t < 0.3: pass",
     "print('burnt', flush=True)", "input()"]
)  # fmt: skip


def test_every_headline_figure_belongs_to_the_item_that_measures_it() -> None:
    assert all(_item_of(key) in ITEMS for key in REQUIRED)
    assert _item_of("concurrency_ratio") == "io"
    assert _item_of("concurrency_ratio_1000") == "ceiling"  # not the I/O item's, whose prefix it shares
    assert _item_of("scale_x4") == _item_of("floor_scale_x4") == "scale"
    assert _item_of("per_step_ratio_pg") == "overhead"


def test_the_cpu_meter_counts_what_a_child_process_burns_while_it_lives() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        meter = CpuMeter([child.pid]).start()
        assert child.stdout is not None and child.stdout.readline() == "burnt\n"
        use = meter.stop()
    finally:
        child.communicate("\n", timeout=10)
    # The child burnt at least 0.3 s of CPU in the window (less what it burnt before `start`).
    assert use.cores * use.seconds >= 0.2
    assert 0.0 < use.machine <= 1.0
