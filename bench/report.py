"""RESULTS.md and results.json: what a benchmark run writes (`write`), RESULTS.md written again
from results.json (`render`), and one section's figures merged into them (`merge`). Apart from
`bench.__main__` so that a benchmark run alone (`python -m bench.listing`, `python -m
bench.page`) writes its figures without importing every other benchmark."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.stats import Row, Section

HERE = Path(__file__).resolve().parent
#: Figures a quick run does not measure (tests/chaos/test_default_recovery.py shows the same).
NOT_QUICK = ("recovery_default_s",)
REQUIRED = (
    "per_step_ratio_pg", "per_step_ratio_sqlite", "e2e_ms_median_pg", "flat_time_ratio_pg", "flat_bytes_ratio_pg",
    "flat_time_ratio_sqlite", "flat_bytes_ratio_sqlite", "concurrency_ratio", "recovery_s", "recovery_budget_s",
    "recovery_default_s", "ttft_ratio_pg", "ttft_ratio_sqlite", "stream_step_ratio_pg", "listing_ms_pg",
    "history_step_ratio_pg", "history_step_ratio_sqlite", "page_load_1000_ms",
    "scale_x2", "scale_x4", "floor_scale_x4", "concurrency_ratio_1000",
    "decision_ratio_pg", "decision_ratio_sqlite", "paused_tasks_pg", "paused_leases_pg",
    "provider_cpu_ratio_claude", "provider_cpu_ratio_gemini", "provider_step_ratio_claude",
    "provider_step_ratio_gemini", "mcp_call_ratio",
)  # fmt: skip


def render(out: Path) -> int:
    """Rewrite RESULTS.md from results.json (after editing FINDINGS.md, say); results.json is
    left as it is."""
    data = json.loads((out / "results.json").read_text())
    sections = []
    for s in data["sections"]:
        section = Section(s["title"], rows=[Row.from_json(r) for r in s["rows"]], notes=s["notes"])
        section.seconds = s["seconds"]
        sections.append(section)
    _markdown(out, data, sections)
    return 0


def merge(out: Path, section: Section, *, replaces: Callable[[str], bool]) -> None:
    """Put a benchmark's section and figures into out/results.json, in place of the sections
    whose titles `replaces` (an earlier run of it: where the first of them was, else last), the
    other figures kept; then RESULTS.md again. What a benchmark run alone writes
    (`python -m bench.listing`, `bench.page`)."""
    path = out / "results.json"
    if not path.exists():
        write(out, [section], dict(section.numbers), quick=False, elapsed=section.seconds)
        return
    data = json.loads(path.read_text())
    meta, sections = data.pop("meta"), data.pop("sections")
    data.update({k: round(v, 6) if math.isfinite(v) else None for k, v in section.numbers.items()})
    entry = {
        "title": section.title, "seconds": round(section.seconds, 1), "rows": [r.to_json() for r in section.rows],
        "notes": section.notes,
    }  # fmt: skip
    # In the place of the first section it replaces (an earlier run's), else last.
    at = next((i for i, s in enumerate(sections) if replaces(s["title"])), len(sections))
    kept = [s for s in sections if not replaces(s["title"])]
    sections = [*kept[:at], entry, *kept[at:]]
    merged = {**dict(sorted(data.items())), "meta": meta, "sections": sections}
    path.write_text(json.dumps(merged, indent=2, ensure_ascii=False) + "\n")
    render(out)


def write(
    out: Path, sections: list[Section], numbers: dict[str, float], *, quick: bool, elapsed: float,
    when: str | None = None,
) -> None:  # fmt: skip
    """Write results.json and RESULTS.md for a run's sections and figures."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "when": when or datetime.now(UTC).isoformat(timespec="seconds"), "quick": quick, "seconds": round(elapsed, 1),
        "python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
    }  # fmt: skip
    data = {
        **{k: (round(v, 6) if math.isfinite(v) else None) for k, v in sorted(numbers.items())},
        "meta": meta,
        "sections": [
            {"title": s.title, "seconds": round(s.seconds, 1), "rows": [r.to_json() for r in s.rows], "notes": s.notes}
            for s in sections
        ],
    }
    (out / "results.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    _markdown(out, data, sections)


def _markdown(out: Path, data: dict[str, Any], sections: list[Section]) -> None:
    """RESULTS.md: the table of every section's rows, the headline figures, the findings."""
    meta = data["meta"]
    lines = [
        "# Ratchet benchmark results",
        "",
        f"Measured {meta['when']} on {meta['cpus']} CPUs, Python {meta['python']}"
        f"{' (quick run: fewer rounds, shorter runs)' if meta['quick'] else ''}; {meta['seconds']:.0f} s in all. "
        "How to read this: [README.md](README.md).",
        "",
        "| what | setup | median | min-max | rounds | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for s in sections:
        lines.append(f"| **{s.title}** | | | | | |")
        for row in s.rows:
            lines.append("| " + " | ".join(c.replace("|", "/") for c in row.cells()) + " |")
    lines += ["", "## Headline numbers", "", "```json"]
    lines += [json.dumps({k: data[k] for k in REQUIRED if k in data}, indent=2)]
    lines += ["```", ""]
    findings = HERE / "FINDINGS.md"
    if findings.exists():
        lines += [findings.read_text().rstrip(), ""]
    (out / "RESULTS.md").write_text("\n".join(lines))
