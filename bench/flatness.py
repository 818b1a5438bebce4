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

import sqlite3
from pathlib import Path

import redis
from sqlalchemy import Engine, create_engine, select, text
from sqlalchemy.engine import make_url

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

    def bytes_since(self, start: object) -> float:
        if self.sqlite:
            wal = self.path.with_name(self.path.name + "-wal")
            return float((wal.stat().st_size if wal.exists() else 0) + self.path.stat().st_size - int(start))  # type: ignore[call-overload]
        assert self.engine is not None
        with self.engine.connect() as conn:
            end = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar()
            if not self.walinspect:
                return float(conn.execute(text("SELECT pg_wal_lsn_diff(:e, :s)"), {"e": end, "s": start}).scalar())
            pattern = f"%/{self.dboid}/%"
            return float(conn.execute(text(
                "WITH r AS (SELECT xid, record_length, block_ref FROM pg_get_wal_records_info(:s, :e)) "
                "SELECT coalesce(sum(record_length), 0) FROM r WHERE block_ref LIKE :p "
                "OR (xid <> 0 AND xid IN (SELECT xid FROM r WHERE block_ref LIKE :p))"
            ), {"s": start, "e": end, "p": pattern}).scalar())  # fmt: skip

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()


def one_run(
    client: Client, store: Store, meter: Meter, r: redis.Redis, points: list[int]
) -> dict[int, tuple[float, float]]:
    """One long run; per window start a: (bytes per step, median ms per step)."""
    gates = sorted({g for a in points for g in (a, a + WINDOW)})
    last = max(gates) + 2
    batches = last // 2 + 1
    handle = client.start("bench-instant", input=f"batches={batches} gates={','.join(map(str, gates))}")
    run_id = handle.run_id
    readings: dict[int, object] = {}
    sizes: dict[int, float] = {}
    for gate in gates:
        got = r.blpop([f"bench:gate:{run_id}:arrived"], timeout=120)
        if got is None:
            raise TimeoutError(f"the run never reached step {gate}")
        seq = int(got[1])
        if seq in points:
            readings[seq] = meter.start()
        else:
            sizes[seq - WINDOW] = meter.bytes_since(readings[seq - WINDOW])
        r.rpush(f"bench:gate:{run_id}:go", 1)
    record = wait_until(lambda: (x := store.get_record(run_id)).status.is_final and x, 300, what="the long run")
    assert record.status == RunStatus.COMPLETED, record
    with store.engine.connect() as conn:
        stamps = [row.created_at for row in conn.execute(
            select(messages.c.created_at).where(messages.c.run_id == run_id).order_by(messages.c.idx)
        )]  # fmt: skip
    # Step s commits message s+1 (message 0 is the user's); gap s = its commit minus the previous one.
    result = {}
    for a in points:
        gaps = [(stamps[s + 1] - stamps[s]) * 1000 for s in range(a + 1, a + WINDOW)]
        result[a] = (sizes[a] / WINDOW, median(gaps))
    return result


def measure(rig: Rig, env: BenchEnv, *, rounds: int, far: int) -> Section:
    meter = Meter(rig.url)
    points = [10, 100, far]
    r = redis.Redis.from_url(env.redis_url)
    results = [one_run(rig.client, rig.store, meter, r, points) for _ in range(rounds)]
    meter.close()
    db = rig.db
    name = rig.name
    setup = f"{name}, one run of {far + WINDOW + 3} steps, window of {WINDOW} steps"
    rows: list[Row] = []
    numbers: dict[str, float] = {}
    for what, i, unit in (("time", 1, "ms"), ("bytes", 0, "B")):
        base = [res[10][i] for res in results]
        for p in points:
            values = [res[p][i] for res in results]
            ratios = [res[p][i] / res[10][i] for res in results]
            is_far = p == far
            rows.append(Row(
                f"{what.capitalize()} per step at step {p} ({db})",
                setup + (f"; {meter.method}" if what == "bytes" else ""), values, unit,
                ratio=median(ratios) if p != 10 else None, ratio_note="vs step 10" if p != 10 else "",
                target="≤ 1.15x" if is_far else "", met=(median(ratios) <= 1.15) if is_far else None,
                digits=3 if unit == "ms" else 0,
            ))  # fmt: skip
        numbers[f"flat_{what}_ratio_{db}"] = median([res[far][i] / res[10][i] for res in results])
        numbers[f"flat_{what}_step10_{db}"] = median(base)
    section = Section(f"Flatness on {name}: step 10 vs 100 vs {far}", rows=rows, numbers=numbers)
    section.numbers[f"flat_far_step_{db}"] = float(far)
    return section
