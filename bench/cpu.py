"""CPU use over a measured window, from /proc: the CPU seconds of chosen processes and their
descendants (utime + stime of /proc/<pid>/stat, every thread included), and how busy the whole
machine was (/proc/stat). A throughput figure means something only where neither ran out."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu_seconds(roots: Iterable[int]) -> float:
    """CPU seconds used so far by these processes and every live descendant of theirs."""
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            got = _stat(int(entry.name))
            if got is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = got
    wanted = set(roots)
    total = 0.0
    for pid in cpu:
        p = pid
        while p and p not in wanted:
            p = parents.get(p, 0)
        if p:
            total += cpu[pid]
    return total


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot (/proc/stat; idle and iowait are not busy)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(values[:8])  # guest time is already counted in user
    return total - values[3] - values[4], total


@dataclass
class CpuUse:
    """What a window cost: the chosen processes' CPU in cores (1.0 = one core all the time), the
    machine's busy share of all its cores, and the window's length."""

    cores: float
    machine: float
    seconds: float


class CpuMeter:
    """`start()`, the work, `stop()`: the CPU the processes under `roots` used in between."""

    def __init__(self, roots: Iterable[int]) -> None:
        self.roots = list(roots)
        self._t0 = 0.0
        self._cpu0 = 0.0
        self._busy0: tuple[float, float] = (0.0, 0.0)

    def start(self) -> CpuMeter:
        self._t0, self._cpu0, self._busy0 = time.monotonic(), tree_cpu_seconds(self.roots), machine_busy()
        return self

    def stop(self) -> CpuUse:
        seconds = time.monotonic() - self._t0
        busy, total = machine_busy()
        machine = (busy - self._busy0[0]) / max(total - self._busy0[1], 1.0)
        return CpuUse((tree_cpu_seconds(self.roots) - self._cpu0) / max(seconds, 1e-9), machine, seconds)
