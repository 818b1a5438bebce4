"""The benchmarks' bookkeeping: which item owes each headline figure (so `--only` asks only for
the figures it measured), the CPU meter the scaling benchmark reports beside each figure, and a
benchmark run alone merged into the results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.__main__ import ITEMS, REQUIRED, _item_of
from bench.cpu import CpuMeter
from bench.report import merge, write
from bench.stats import Row, Section

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


def _section(title: str, figure: float) -> Section:
    section = Section(title, rows=[Row(f"{title} figure", "setup", [figure], "ms")])
    section.numbers[f"{title.lower()}_ms"] = figure
    return section


def test_a_benchmark_run_alone_takes_the_place_of_its_earlier_section_and_keeps_the_other_figures(
    tmp_path: Path,
) -> None:
    sections = [_section("First", 1.0), _section("Second", 2.0), _section("Third", 3.0)]
    write(tmp_path, sections, {"first_ms": 1.0, "second_ms": 2.0, "third_ms": 3.0}, quick=False, elapsed=1.0)

    merge(tmp_path, _section("Second", 5.0), replaces=lambda title: title == "Second")
    merge(tmp_path, _section("Fourth", 4.0), replaces=lambda title: title == "Fourth")

    data = json.loads((tmp_path / "results.json").read_text())
    assert [s["title"] for s in data["sections"]] == ["First", "Second", "Third", "Fourth"]
    assert (data["first_ms"], data["second_ms"], data["third_ms"], data["fourth_ms"]) == (1.0, 5.0, 3.0, 4.0)
    table = (tmp_path / "RESULTS.md").read_text()
    assert table.index("First figure") < table.index("Second figure") < table.index("Third figure")
