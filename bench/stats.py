"""Figures and how they are reported: medians over rounds, ratios against a floor measured in the
same run, and the RESULTS.md table."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.testing.waiting import wait_until  # noqa: F401  (re-exported for the benchmarks)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def interleave(rounds: int, *runs: Callable[[], float]) -> list[list[float]]:
    """Run A B A B ... for `rounds` rounds; the samples of each, in order. Alternating the order
    and pairing each A with its B keeps the machine's drift out of the ratios."""
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(rounds):
        for i, run in enumerate(runs):
            samples[i].append(run())
    return samples


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Round-by-round ratios (each numerator against the floor measured next to it)."""
    return [n / d for n, d in zip(numerators, denominators, strict=True)]


@dataclass
class Row:
    """One line of RESULTS.md: a measured figure over rounds, with its ratio to a floor."""

    what: str
    setup: str
    samples: list[float]
    unit: str
    ratio: float | None = None
    ratio_note: str = ""
    target: str = ""
    met: bool | None = None
    digits: int = 2

    @property
    def median(self) -> float:
        return median(self.samples)

    def fmt(self, value: float) -> str:
        return f"{value:.{self.digits}f}"

    def cells(self) -> list[str]:
        spread = f"{self.fmt(min(self.samples))}-{self.fmt(max(self.samples))}" if self.samples else "-"
        ratio = f"{self.ratio:.2f}x {self.ratio_note}".strip() if self.ratio is not None else self.ratio_note or "-"
        if self.target:
            mark = "" if self.met is None else (" ✅" if self.met else " ❌")
            ratio += f" (target {self.target}{mark})"
        return [self.what, self.setup, f"{self.fmt(self.median)} {self.unit}", spread, str(len(self.samples)), ratio]

    def to_json(self) -> dict[str, Any]:
        return {
            "what": self.what, "setup": self.setup, "unit": self.unit, "median": _num(self.median),
            "min": _num(min(self.samples)) if self.samples else None,
            "max": _num(max(self.samples)) if self.samples else None, "samples": [_num(s) for s in self.samples],
            "ratio": _num(self.ratio), "ratio_note": self.ratio_note, "target": self.target, "met": self.met,
            "digits": self.digits,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        """Rebuild a row written by `to_json` (to render RESULTS.md again)."""
        unit = data["unit"]
        digits = data.get("digits", 0 if unit == "B" else 1 if unit in ("MiB", "steps/s") else 2 if unit == "s" else 3)
        return cls(
            data["what"], data["setup"], [s for s in data["samples"] if s is not None], unit, ratio=data["ratio"],
            ratio_note=data["ratio_note"], target=data["target"], met=data["met"], digits=digits,
        )  # fmt: skip


def _num(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, 6)


@dataclass
class Section:
    """The rows and headline numbers of one benchmark, plus findings in words."""

    title: str
    rows: list[Row] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def timed(fn: Callable[[], Section]) -> Section:
    t0 = time.monotonic()
    section = fn()
    section.seconds = time.monotonic() - t0
    return section
