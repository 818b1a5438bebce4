"""Item 9, first part ("scale"): does throughput grow with worker processes as Celery's does?

I/O-bound runs (model call -> tool batch -> model call; the scripted model, in its own process,
answers each call after 0.2 s) on 1, 2 and 4 model-worker processes, against the floor with the
same numbers of processes, in the same run, on PostgreSQL (workers on several hosts share a
server database).

Layout, the same for both sides so that the comparison is fair:
- Ratchet: N processes on the model queue (`ratchet worker -Q <model> -P threads -c C`) and one
  more on the tools and control queues, the same one in every configuration (a tool batch here
  is a no-op, so one process keeps up with four model workers).
- The floor: N processes on the queue of the hops that call the model (through the openai
  client, as Ratchet's adapter does) and one more on a side queue for the hop between them
  (`bench.floor`'s `side`), the same shape of chain (call, transaction, hop, transaction, call,
  transaction).

C (threads a process) is chosen so that the machine's two cores are not the limit: at 4
processes the workers of either side must use well under a core between them, or the figure
measures the cores, not Ratchet. The CPU they used (from /proc: their utime + stime over each
round) and how busy the whole machine was are reported beside each figure, as is the load
average: other work on the machine shows up there.

All ten workers start once; a configuration of N turns the model queue on in the first N model
workers of each side and off in the others (Celery's `add_consumer` and `cancel_consumer`), so
a configuration costs no start-up. Runs per round: `runs_per_slot` x N x C, so every
configuration's round lasts about as long. The configurations are visited up and down (1, 2, 4,
4, 2, 1, ...), a floor round and a Ratchet round each visit; the k-th visits form a pass, whose
speed-ups the machine's drift skews less than figures taken minutes apart, and the figures are
medians over passes. Speed-up N = steps/s at N processes / steps/s at 1.
Target: Ratchet's speed-up from 1 to 4 is at least 0.9x the floor's.
"""

from __future__ import annotations

import os

from bench.env import BenchEnv
from bench.fleet import FloorSide, RatchetSide, Sample, close, describe_cpu, scripted_model
from bench.stats import Row, Section, median, paired_ratios

DELAY_S = 0.2
PROCESSES = (1, 2, 4)
#: Threads a worker process in a full run. A step costs the workers 7-9 ms of CPU here (the openai
#: client, Celery, the transactions, and the upkeep of the idle workers): at 4 processes a side,
#: 4 x 4 / 0.2 s model calls a second and half as many tool batches use about one core, and
#: the machine is then about 50-65% busy. With 8, it was 95% busy and the floor reached 0.61x of
#: its ideal: the cores were the limit.
PER_PROCESS = 4
TARGET = 0.9


def measure(env: BenchEnv, *, per_process: int, runs_per_slot: int, passes: int) -> Section:
    """Each configuration is measured `passes` times, visited up and down: 1, 2, 4, 4, 2, 1, ..."""
    order = [n for k in range(passes) for n in (PROCESSES if k % 2 == 0 else PROCESSES[::-1])]
    ratchet: dict[int, list[Sample]] = {n: [] for n in PROCESSES}
    floor: dict[int, list[Sample]] = {n: [] for n in PROCESSES}
    load = os.getloadavg()[0]
    c = per_process
    with scripted_model(DELAY_S) as (model_url, model_pid):
        r_side, f_side = _sides(env, model_url, c)
        try:
            for n in order:
                r_side.use(n)
                f_side.use(n)
                floor[n].append(f_side.measure(runs_per_slot * n * c, model_pid))
                ratchet[n].append(r_side.measure(runs_per_slot * n * c, model_pid))
        finally:
            close(r_side, f_side)
    return _section(ratchet, floor, c, runs_per_slot, load, os.getloadavg()[0])


def _sides(env: BenchEnv, model_url: str, c: int) -> tuple[RatchetSide, FloorSide]:
    """Both sides' workers, started, ready and warmed up: four switched model workers each, and
    the one worker for the tools and control queues (the floor's side queue)."""
    url = env.db_url("pg")
    settings = env.settings(url, "scale")
    ratchet = RatchetSide(env, settings, model_url)
    floor = FloorSide(env, url, model_url, "scale-floor", side=True)
    for _ in range(max(PROCESSES)):
        ratchet.add("threads", c, switched=True)
        floor.add("threads", c, switched=True)
    ratchet.add("threads", c, queues=[settings.tools_queue, settings.control_queue])
    floor.add("threads", c, side=True)
    try:
        ratchet.spawn()
        floor.spawn()
        ratchet.wait_ready()
        floor.wait_ready()
        n = max(PROCESSES) * c
        floor.throughput(n), ratchet.throughput(n)  # warm-up: every thread's connections
    except BaseException:
        close(ratchet, floor)
        raise
    return ratchet, floor


def _speedups(samples: dict[int, list[Sample]], n: int) -> list[float]:
    """Speed-up from 1 to n processes in each pass (the k-th sample of each configuration)."""
    return [a.steps_per_s / b.steps_per_s for a, b in zip(samples[n], samples[1], strict=False)]


def _section(
    ratchet: dict[int, list[Sample]], floor: dict[int, list[Sample]], c: int, runs_per_slot: int,
    load0: float, load1: float,
) -> Section:  # fmt: skip
    rows: list[Row] = []
    numbers: dict[str, float] = {"scale_threads_per_process": float(c), "scale_loadavg": (load0 + load1) / 2}
    for n in PROCESSES:
        rows += _config_rows(n, ratchet[n], floor[n], c, runs_per_slot * n * c)
        for prefix, samples in (("scale", ratchet[n]), ("floor_scale", floor[n])):
            numbers[f"{prefix}_steps_per_s_x{n}"] = median([s.steps_per_s for s in samples])
            numbers[f"{prefix}_cpu_cores_x{n}"] = median([s.workers.cores for s in samples])
            numbers[f"{prefix}_cpu_ms_x{n}"] = median([s.cpu_ms_per_step for s in samples])
        numbers[f"scale_machine_busy_x{n}"] = median([s.workers.machine for s in ratchet[n] + floor[n]])
    for n in PROCESSES[1:]:
        rs, fs = _speedups(ratchet, n), _speedups(floor, n)
        numbers[f"scale_x{n}"], numbers[f"floor_scale_x{n}"] = median(rs), median(fs)
        rows.append(Row(f"Floor: speed-up from 1 to {n} processes", "per pass", fs, "x", digits=2))
        vs = numbers[f"scale_x{n}"] / numbers[f"floor_scale_x{n}"]
        target = {"target": f"≥ {TARGET}x the floor's", "met": vs >= TARGET} if n == 4 else {}
        rows.append(Row(f"Ratchet: speed-up from 1 to {n} processes", "per pass", rs, "x", ratio=vs,
                        ratio_note="of the floor's speed-up", digits=2, **target))  # type: ignore[arg-type]  # fmt: skip
    numbers["scale_x4_vs_floor"] = numbers["scale_x4"] / numbers["floor_scale_x4"]
    notes = [f"Load average {load0:.1f} at the start, {load1:.1f} at the end (2 cores)."]
    title = f"Scaling with worker processes on PostgreSQL (model calls {DELAY_S} s)"
    return Section(title, rows=rows, numbers=numbers, notes=notes)


def _config_rows(n: int, ratchet: list[Sample], floor: list[Sample], c: int, n_runs: int) -> list[Row]:
    r, f = [s.steps_per_s for s in ratchet], [s.steps_per_s for s in floor]
    ideal = n * c / DELAY_S * 3 / 2
    setup = f"{n} + 1 processes, -P threads -c {c}, {n_runs} runs"
    plural = "es" if n > 1 else ""
    return [
        Row(f"Floor: {n} model-hop process{plural}, steps/s", f"{setup}; {describe_cpu(floor)}", f, "steps/s",
            ratio=median(f) / ideal, ratio_note=f"of the ideal {ideal:.0f}/s", digits=1),
        Row(f"Ratchet: {n} model-worker process{plural}, steps/s", f"{setup}; {describe_cpu(ratchet)}", r, "steps/s",
            ratio=median(paired_ratios(r, f)), ratio_note="of floor", digits=1),
    ]  # fmt: skip
