"""Item 4: does a step cost the same at step 10, 100 and 1000 of one long run?

One run of `InstantModel` (a model whose own cost does not grow with the transcript) pauses at
chosen steps; at each pause this process takes a reading while the worker holds no
transaction. Bytes per step over the window [a, b) of steps:

- PostgreSQL: WAL bytes between the two readings, counting only records of the benchmark's
  database (pg_walinspect: records whose blocks belong to it, and their transactions' commit
  records), so other databases on the cluster do not count; a CHECKPOINT at the window's start
  makes every window pay the full-page images of the pages it touches first, as it would after
  any checkpoint. Without pg_walinspect: the raw WAL position difference.
- SQLite: at the window's start a TRUNCATE checkpoint empties the WAL; at its end, the WAL's size
  plus the database file's growth is what the window wrote.

Time per step: the gaps between consecutive commits (the messages' created_at) inside each
window, the paused step left out; the median of those.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import redis
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.engine import make_url

from bench.agents import pop
from bench.env import BenchEnv
from bench.rig import Rig
from bench.stats import Row, Section, median, wait_until
from orchestrator.client import Client
from orchestrator.status import RunStatus
from orchestrator.store import Store
from orchestrator.store.schema import messages

WINDOW = 10


class Meter:
    """Readings of bytes written to a store."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = make_url(url).get_backend_name() == "sqlite"
        self.walinspect = False
        self.engine: Engine | None = None
        if self.sqlite:
            self.path = Path(make_url(url).database or "")
        else:
            self.engine = create_engine(url, isolation_level="AUTOCOMMIT")
            with self.engine.connect() as conn:
                try:
                    conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
                    self.walinspect = True
                except Exception:
                    self.walinspect = False
                self.dboid = conn.execute(
                    text("SELECT oid FROM pg_database WHERE datname = current_database()")
                ).scalar()

    @property
    def method(self) -> str:
        if self.sqlite:
            return "SQLite WAL + file growth"
        return "PostgreSQL WAL, this database only (pg_walinspect)" if self.walinspect else "PostgreSQL WAL position"

    def start(self) -> object:
        if self.sqlite:
            conn = sqlite3.connect(self.path, timeout=30)
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            conn.close()
            if busy:
                raise RuntimeError("the WAL could not be truncated: a transaction was open")
            return self.path.stat().st_size
        assert self.engine is not None
        with self.engine.connect() as conn:
            conn.execute(text("CHECKPOINT"))
            return conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar()

    def bytes_since(self, start: object) -> tuple[float, float]:
        """Bytes written since `start`: (all of it, without PostgreSQL's full-page images)."""
        if self.sqlite:
            wal = self.path.with_name(self.path.name + "-wal")
            written = (wal.stat().st_size if wal.exists() else 0) + self.path.stat().st_size - int(str(start))
            return float(written), float(written)
        assert self.engine is not None
        with self.engine.connect() as conn:
            end = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar()
            # pg_walinspect reads only flushed WAL; claims commit without waiting for the flush,
            # so let the WAL writer catch up (it flushes every 200 ms at most).
            # A reading taken before the flush would count too few bytes: fail instead.
            flushed = text("SELECT pg_wal_lsn_diff(:e, pg_current_wal_flush_lsn()) <= 0")
            wait_until(lambda: conn.execute(flushed, {"e": end}).scalar(), 5, interval=0.005, what="the WAL flush")
            if not self.walinspect:
                diff = conn.execute(text("SELECT pg_wal_lsn_diff(:e, :s)"), {"e": end, "s": start}).scalar()
                return float(diff), math.nan
            row = conn.execute(
                text(
                    "WITH r AS (SELECT xid, record_length, fpi_length, block_ref"
                    "           FROM pg_get_wal_records_info(:s, :e)) "
                    "SELECT coalesce(sum(record_length), 0), coalesce(sum(record_length - fpi_length), 0) FROM r "
                    "WHERE block_ref LIKE :p OR (xid <> 0 AND xid IN (SELECT xid FROM r WHERE block_ref LIKE :p))"
                ),
                {"s": start, "e": end, "p": f"%/{self.dboid}/%"},
            ).one()
            return float(row[0]), float(row[1])

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()


Readings = dict[int, tuple[float, float, float]]


def run_batches(far: int) -> int:
    """Tool batches for a run that goes 2 x WINDOW steps past `far` (a run of 2 x this + 1 steps)."""
    return (far + 2 * WINDOW + 2) // 2 + 1


def one_run(client: Client, store: Store, meter: Meter, r: redis.Redis, points: list[int]) -> Readings:
    """One long run; per window start a: (bytes per step, bytes per step without full-page
    images, median ms per step)."""
    gates = sorted({g for a in points for g in (a, a + WINDOW)})
    batches = run_batches(max(points))
    handle = client.start("bench-instant", input=f"batches={batches} gates={','.join(map(str, gates))}")
    run_id = handle.run_id
    readings: dict[int, object] = {}
    sizes: dict[int, tuple[float, float]] = {}
    for gate in gates:
        got = pop(r, f"bench:gate:{run_id}:arrived", timeout=120)
        if got is None:
            raise TimeoutError(f"the run never reached step {gate}")
        seq = int(got)
        if seq in points:
            readings[seq] = meter.start()
        else:
            sizes[seq - WINDOW] = meter.bytes_since(readings[seq - WINDOW])
        r.rpush(f"bench:gate:{run_id}:go", 1)
    record = wait_until(lambda: (x := store.get_record(run_id)).status.is_final and x, 300, what="the long run")
    assert record.status == RunStatus.COMPLETED, record
    with store.engine.connect() as conn:
        stamps = [
            row.created_at
            for row in conn.execute(
                select(messages.c.created_at).where(messages.c.run_id == run_id).order_by(messages.c.idx)
            )
        ]
    # Step s commits message s+1 (message 0 is the user's): its duration is the gap between the
    # two commits. Time is taken over 2 x WINDOW steps from a, without the two paused steps.
    result = {}
    for a in points:
        gaps = [(stamps[s + 1] - stamps[s]) * 1000 for s in range(a + 1, a + 2 * WINDOW) if s != a + WINDOW]
        total, no_fpi = sizes[a]
        result[a] = (total / WINDOW, no_fpi / WINDOW, median(gaps))
    return result


def measure(rig: Rig, env: BenchEnv, *, rounds: int, far: int) -> Section:
    meter = Meter(rig.url)
    points = [10, 100, far]
    r = redis.Redis.from_url(env.redis_url)
    results = [one_run(rig.client, rig.store, meter, r, points) for _ in range(rounds)]
    meter.close()
    db = rig.db
    name = rig.name
    setup = f"{name}, one run of {2 * run_batches(far) + 1} steps, window of {WINDOW} steps"
    rows: list[Row] = []
    numbers: dict[str, float] = {}
    kinds = [("time", 2, "ms", "Time per step"), ("bytes", 1 if not meter.sqlite else 0, "B", "Bytes per step")]
    if not meter.sqlite:
        kinds.append(("bytes_fpi", 0, "B", "Bytes per step with full-page images"))
    for key, i, unit, label in kinds:
        for p in points:
            values = [res[p][i] for res in results]
            ratios = [res[p][i] / res[10][i] for res in results]
            headline = p == far and key != "bytes_fpi"
            how = {"time": "", "bytes": f"; {meter.method}", "bytes_fpi": f"; {meter.method}, with FPIs"}[key]
            rows.append(
                Row(
                    f"{label} at step {p} ({db})", setup + how, values, unit,
                    ratio=median(ratios) if p != 10 else None, ratio_note="vs step 10" if p != 10 else "",
                    target="≤ 1.15x" if headline else "", met=(median(ratios) <= 1.15) if headline else None,
                    digits=3 if unit == "ms" else 0,
                )
            )  # fmt: skip
        numbers[f"flat_{key}_ratio_{db}"] = median([res[far][i] / res[10][i] for res in results])
        numbers[f"flat_{key}_step10_{db}"] = median([res[10][i] for res in results])
    section = Section(f"Flatness on {name}: step 10 vs 100 vs {far}", rows=rows, numbers=numbers)
    section.numbers[f"flat_far_step_{db}"] = float(far)
    return section
