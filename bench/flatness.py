"""Item 4: does a step cost the same at step 10, 100 and 1000 of one long run?

One run of `InstantModel` (a model whose own cost does not grow with the transcript) pauses at
chosen steps; at each pause this process takes a reading while the worker holds no
transaction. Bytes per step over the window [a, b) of steps:

- PostgreSQL: WAL of the benchmark's database only (pg_walinspect: records whose blocks belong to
  it, and their transactions' commit records), so other databases on the cluster do not count.
  The headline counts the records the steps' statements write (row inserts, updates and locks,
  their index entries, commits), without full-page images. Page upkeep (b-tree page splits and
  the downlinks they add, deduplication, index cleanup, heap pruning) is counted apart: it
  comes once per page filled, a few KB at a time, so a 10-step window holds a split or not
  and its bytes per step move by up to a third from one window to the next (see FINDINGS.md); it
  is reported as bytes per step over all windows of a run. A CHECKPOINT at the window's start
  makes every window pay the full-page images of the pages it touches first, as it would after
  any checkpoint: the third figure is everything, images and upkeep included.
  Without pg_walinspect: the raw WAL position difference.
- SQLite: at the window's start a TRUNCATE checkpoint empties the WAL; at its end, the WAL's size
  plus the database file's growth is what the window wrote.

Time per step: the gaps between consecutive commits (the messages' created_at) inside each
window, the paused step left out; the median of those.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import NamedTuple

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
from orchestrator.store.tables import messages

WINDOW = 10

#: WAL records (resource manager/record type, without "+INIT") written when a page fills or is
#: cleaned up rather than by every statement: b-tree splits and the downlinks they add, new roots,
#: deduplication and deletion of dead index entries, page deletion, heap pruning and vacuum, and
#: images logged for hint bits. PostgreSQL 15-17 names.
UPKEEP = (
    "Btree/SPLIT_L", "Btree/SPLIT_R", "Btree/INSERT_UPPER", "Btree/NEWROOT", "Btree/DEDUP", "Btree/DELETE",
    "Btree/VACUUM", "Btree/MARK_PAGE_HALFDEAD", "Btree/UNLINK_PAGE", "Btree/UNLINK_PAGE_META", "Btree/REUSE_PAGE",
    "Btree/META_CLEANUP", "Heap2/PRUNE", "Heap2/PRUNE_ON_ACCESS", "Heap2/PRUNE_VACUUM_SCAN",
    "Heap2/PRUNE_VACUUM_CLEANUP", "Heap2/VACUUM", "Heap2/FREEZE_PAGE", "Heap2/VISIBLE", "XLOG/FPI",
    "XLOG/FPI_FOR_HINT",
)  # fmt: skip

#: This database's WAL records between two positions: (all bytes, bytes of the statements'
#: records without full-page images, bytes of page upkeep without full-page images).
_WAL_BYTES = text(
    "WITH r AS (SELECT xid, resource_manager || '/' || split_part(record_type, '+', 1) AS kind,"
    "                  record_length, fpi_length, block_ref"
    "           FROM pg_get_wal_records_info(:s, :e)),"
    " mine AS (SELECT kind = ANY(:upkeep) AS upkeep, record_length, fpi_length FROM r"
    "          WHERE block_ref LIKE :p OR (xid <> 0 AND xid IN (SELECT xid FROM r WHERE block_ref LIKE :p))) "
    "SELECT coalesce(sum(record_length), 0),"
    "       coalesce(sum(record_length - fpi_length) FILTER (WHERE NOT upkeep), 0),"
    "       coalesce(sum(record_length - fpi_length) FILTER (WHERE upkeep), 0) FROM mine"
)


class Written(NamedTuple):
    """Bytes a window wrote: everything; the steps' own records (PostgreSQL: without full-page
    images or page upkeep); page upkeep without images (NaN where not measured)."""

    total: float
    steps: float
    upkeep: float


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
        if not self.walinspect:
            return "PostgreSQL WAL position"
        return "PostgreSQL WAL of this database (pg_walinspect): the steps' records, without FPIs or page upkeep"

    @property
    def method_all(self) -> str:
        """How the figure with full-page images is taken."""
        if not self.walinspect:
            return "PostgreSQL WAL position"
        return "PostgreSQL WAL of this database (pg_walinspect): all records, with FPIs and page upkeep"

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

    def bytes_since(self, start: object) -> Written:
        """Bytes written since `start`."""
        if self.sqlite:
            wal = self.path.with_name(self.path.name + "-wal")
            written = (wal.stat().st_size if wal.exists() else 0) + self.path.stat().st_size - int(str(start))
            return Written(float(written), float(written), math.nan)
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
                return Written(float(diff), float(diff), math.nan)
            row = conn.execute(
                _WAL_BYTES, {"s": start, "e": end, "p": f"%/{self.dboid}/%", "upkeep": list(UPKEEP)}
            ).one()
            return Written(float(row[0]), float(row[1]), float(row[2]))

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()


class Window(NamedTuple):
    """What one window cost per step: median ms; the steps' own bytes (the headline); all bytes
    (PostgreSQL: with full-page images and page upkeep); page upkeep bytes."""

    ms: float
    steps: float
    total: float
    upkeep: float


Readings = dict[int, Window]


def run_batches(far: int) -> int:
    """Tool batches for a run that goes 2 x WINDOW steps past `far` (a run of 2 x this + 1 steps)."""
    return (far + 2 * WINDOW + 2) // 2 + 1


def one_run(client: Client, store: Store, meter: Meter, r: redis.Redis, points: list[int]) -> Readings:
    """One long run; what a step cost in the window of each start in `points`."""
    gates = sorted({g for a in points for g in (a, a + WINDOW)})
    batches = run_batches(max(points))
    handle = client.start("bench-instant", input=f"batches={batches} gates={','.join(map(str, gates))}")
    run_id = handle.run_id
    readings: dict[int, object] = {}
    sizes: dict[int, Written] = {}
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
        size = sizes[a]
        result[a] = Window(median(gaps), size.steps / WINDOW, size.total / WINDOW, size.upkeep / WINDOW)
    return result


def measure(rig: Rig, env: BenchEnv, *, rounds: int, far: int) -> Section:
    meter = Meter(rig.url)
    points = [10, 100, far]
    r = redis.Redis.from_url(env.redis_url)
    results = [one_run(rig.client, rig.store, meter, r, points) for _ in range(rounds)]
    meter.close()
    db = rig.db
    setup = f"{rig.name}, one run of {2 * run_batches(far) + 1} steps, window of {WINDOW} steps"
    rows: list[Row] = []
    numbers: dict[str, float] = {}
    kinds = [("time", "ms", "ms", "Time per step", ""), ("bytes", "steps", "B", "Bytes per step", meter.method)]
    if not meter.sqlite:
        kinds.append(("bytes_fpi", "total", "B", "Bytes per step with full-page images", meter.method_all))
    for key, field, unit, label, how in kinds:
        for p in points:
            values = [getattr(res[p], field) for res in results]
            ratio = median([getattr(res[p], field) / getattr(res[10], field) for res in results])
            headline = p == far and key != "bytes_fpi"
            rows.append(
                Row(
                    f"{label} at step {p} ({db})", setup + (f"; {how}" if how else ""), values, unit,
                    ratio=ratio if p != 10 else None, ratio_note="vs step 10" if p != 10 else "",
                    target="≤ 1.15x" if headline else "", met=(ratio <= 1.15) if headline else None,
                    digits=3 if unit == "ms" else 0,
                )
            )  # fmt: skip
            if p == far:
                numbers[f"flat_{key}_ratio_{db}"] = ratio
        numbers[f"flat_{key}_step10_{db}"] = median([getattr(res[10], field) for res in results])
    if meter.walinspect:
        # Splits come once per page filled: over one window they are noise, over all of a
        # run's windows they are what they cost a step on average.
        upkeep = [sum(res[p].upkeep for p in points) / len(points) for res in results]
        rows.append(Row(
            f"Page upkeep per step, windows at {', '.join(map(str, points))} together ({db})",
            setup + "; b-tree splits, index cleanup, heap pruning: WAL records without FPIs", upkeep, "B",
            ratio_note="not in the bytes above", digits=0,
        ))  # fmt: skip
        numbers[f"flat_upkeep_per_step_{db}"] = median(upkeep)
    section = Section(f"Flatness on {rig.name}: step 10 vs 100 vs {far}", rows=rows, numbers=numbers)
    section.numbers[f"flat_far_step_{db}"] = float(far)
    return section
