"""Item 12: what a step writes to `ratchet_runs` on PostgreSQL, before and after migration
0015_run_storage. `python -m bench.updates [--runs N] [--batches N] [--rounds R] [--out DIR]`
runs it alone and merges its figures into DIR/results.json (and RESULTS.md), as `bench.listing`;
`python -m bench --only updates` runs it with the rest.

Two private databases, both migrated to the head: the floor's then has 0015's changes undone
(`UNDO`: the fillfactor reset, the two indexes full again), so it is the schema as it was before
0015 with every later column the code writes; the other is the head. Each round, on each
database in turn (which goes first alternates):

- steps: `--runs` runs of `bench-instant` (`--batches` tool batches each: 2 x batches + 1 steps)
  are started, then their steps run through Ratchet's real step runner (the in-memory
  dispatcher, one step of each run in turn, as a busy worker's queue holds them), so that the
  runs' rows share the table's pages as a fleet's do. The runs' creation is not measured.
- renewals: the first step of `--runs` more runs is claimed, then their leases are renewed 20
  times, as a worker's heartbeat renews them while its steps wait on the model.

Measured:

- WAL bytes per step (or per renewed lease): this database's records (pg_walinspect: records
  whose blocks belong to it, and their transactions' commit records), without full-page images;
  of them, the run rows' indexes. Without pg_walinspect: the WAL position difference of the
  whole cluster, and no HOT share.
- HOT share: of the run rows' updates, those PostgreSQL did in place (heap-only tuples: no index
  entry written), from the WAL's update records of the table (Heap/HOT_UPDATE against
  Heap/UPDATE): what pg_stat_user_tables counts in n_tup_hot_upd and n_tup_upd, without waiting
  for the backends to flush their statistics.
- Time per step: the steps' wall time over their number (the WAL readings between them untimed).

Each ratio is the head's figure over the floor's in the same round; the median over rounds.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import NamedTuple

from sqlalchemy import Connection, Engine, create_engine, text

from bench.env import BenchEnv, bench_env
from bench.report import merge
from bench.stats import Row, Section, median
from orchestrator.settings import Settings
from orchestrator.testing import InMemoryDispatcher, in_memory
from orchestrator.testing.waiting import wait_until

HERE = Path(__file__).resolve().parent
TITLE = "Run-row updates on PostgreSQL"
#: The migration whose effect is measured; the floor is the schema of the revision before it.
REVISION = "0015_run_storage"
#: Steps between two readings of the WAL.
CHUNK = 100
#: Lease renewals of each run in a round.
RENEWALS = 20
#: WAL by (relation, record kind): (records, bytes without full-page images).
Wal = dict[tuple[str, str], tuple[int, float]]

#: This database's WAL records between two positions, by relation and record kind: (relation
#: name or "", kind, records, bytes without full-page images).
_WAL = text(
    "WITH r AS (SELECT xid, resource_manager || '/' || split_part(record_type, '+', 1) AS kind,"
    "                  record_length - fpi_length AS bytes, regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)') AS rel"
    "           FROM pg_get_wal_records_info(:s, :e)),"
    " mine AS (SELECT * FROM r WHERE rel[1]::oid = :db"
    "          OR (rel IS NULL AND xid <> 0 AND xid IN (SELECT xid FROM r WHERE rel[1]::oid = :db))) "
    "SELECT coalesce(pg_filenode_relation(0, rel[2]::oid)::regclass::text, '') AS relation, kind,"
    "       count(*), sum(bytes) FROM mine GROUP BY 1, 2"
)
_LSN = text("SELECT pg_current_wal_insert_lsn()")


class Written(NamedTuple):
    """What one round's steps (or renewals) wrote and took."""

    n: int
    seconds: float
    #: WAL bytes without full-page images: all, and the run rows' indexes'.
    wal: float
    indexes: float
    #: The run rows' updates, and how many of them were heap-only (HOT).
    updates: int
    hot: int

    def per(self, field: str) -> float:
        return float(getattr(self, field)) / self.n if self.n else math.nan

    @property
    def hot_share(self) -> float:
        return self.hot / self.updates if self.updates else math.nan


class Database:
    """A private database at one schema, and the readings of what its steps write."""

    def __init__(self, url: str, *, undo: bool) -> None:
        self.url = url
        _upgrade(url, "head")
        self.engine: Engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with self.engine.connect() as conn:
            for statement in UNDO if undo else ():
                conn.execute(text(statement))
            self.dboid = conn.execute(text("SELECT oid FROM pg_database WHERE datname = current_database()")).scalar()
            try:
                conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
                self.walinspect = True
            except Exception:
                self.walinspect = False
            rows = conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'ratchet_runs'"))
            self.indexes = {r[0] for r in rows}
        import bench.agents  # noqa: F401  (defines bench-instant)

        self.settings = Settings(
            database_url=url, dispatcher="orchestrator.testing:InMemoryDispatcher", auto_migrate=False
        )

    def run_steps(self, runs: int, batches: int) -> Written:
        """Start `runs` runs, run all their steps, and read what the steps wrote."""
        with in_memory(self.settings, autorun=False) as dispatcher:
            for _ in range(runs):
                dispatcher.client.start("bench-instant", input=f"batches={batches}")
            with self.engine.connect() as conn, self._wal_held(conn):
                count, seconds, wal = self._steps(conn, dispatcher)
        return self._written(count, seconds, wal)

    def renewals(self, runs: int, times: int) -> Written:
        """Claim the first step of `runs` new runs and renew their leases `times` times, as a
        worker's heartbeat does while its steps wait on the model: what the renewals wrote."""
        with in_memory(self.settings, autorun=False) as dispatcher:
            store = dispatcher.store
            ids = [dispatcher.client.start("bench-instant", input="batches=1").run_id for _ in range(runs)]
            claims = [store.claim(i, 0, "model", owner=f"bench:{i}", lease_seconds=600, max_attempts=5) for i in ids]
            held = [(c.run_id, c.epoch, c.record.lease_owner or "") for c in claims if c is not None]
            with self.engine.connect() as conn, self._wal_held(conn):
                start = conn.execute(_LSN).scalar()
                began = time.perf_counter()
                for _ in range(times):
                    store.renew_leases(held, lease_seconds=600)
                seconds = time.perf_counter() - began
                wal = self._wal(conn, start, conn.execute(_LSN).scalar())
        return self._written(len(held) * times, seconds, wal)

    def _written(self, count: int, seconds: float, wal: Wal) -> Written:
        """`count` steps (or renewals) that took `seconds` and wrote `wal`, as figures."""

        def total(rels: Callable[[str], bool], kinds: Callable[[str], bool] = lambda _: True, at: int = 1) -> float:
            return sum(v[at] for (rel, kind), v in wal.items() if rels(rel) and kinds(kind))

        heap = "ratchet_runs".__eq__
        updates = total(heap, lambda k: k in ("Heap/UPDATE", "Heap/HOT_UPDATE"), at=0)
        hot = total(heap, "Heap/HOT_UPDATE".__eq__, at=0)
        return Written(count, seconds, total(lambda _: True), total(self.indexes.__contains__), int(updates), int(hot))

    @contextmanager
    def _wal_held(self, conn: Connection) -> Iterator[None]:
        """Keep the cluster's WAL from here on for the block (a temporary replication slot, dropped
        with its session should the block never end): a busy cluster checkpoints often (creating
        and dropping databases does) and would recycle it before it is read."""
        if not self.walinspect:
            yield
            return
        slot = f"bench_{self.dboid}_{os.getpid()}"
        conn.execute(text("SELECT pg_create_physical_replication_slot(:n, true, true)"), {"n": slot})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_drop_replication_slot(:n)"), {"n": slot})

    def _steps(self, conn: Connection, dispatcher: InMemoryDispatcher) -> tuple[int, float, Wal]:
        """Run the queued steps: how many, their seconds, and their WAL. The WAL is read every
        `CHUNK` steps (untimed), before a checkpoint of a busy cluster can recycle it."""
        steps, seconds, wal = 0, 0.0, dict[tuple[str, str], tuple[int, float]]()
        ran = CHUNK
        while ran == CHUNK:
            start = conn.execute(_LSN).scalar()
            began = time.perf_counter()
            ran = 0
            while ran < CHUNK and dispatcher.run_next() is not None:
                ran += 1
            seconds += time.perf_counter() - began
            steps += ran
            for key, (n, b) in self._wal(conn, start, conn.execute(_LSN).scalar()).items():
                old = wal.get(key, (0, 0.0))
                wal[key] = (old[0] + n, old[1] + b)
        return steps, seconds, wal

    def _wal(self, conn: Connection, start: object, end: object) -> Wal:
        """(relation, kind) -> (records, bytes) between two positions, once the WAL is flushed
        (pg_walinspect reads only flushed WAL; a claim commits without waiting for its flush)."""
        flushed = text("SELECT pg_wal_lsn_diff(:e, pg_current_wal_flush_lsn()) <= 0")
        wait_until(lambda: conn.execute(flushed, {"e": end}).scalar(), 10, interval=0.005, what="the WAL flush")
        if not self.walinspect:
            diff = conn.execute(text("SELECT pg_wal_lsn_diff(:e, :s)"), {"e": end, "s": start}).scalar()
            return {("", "all"): (0, float(diff or 0))}
        rows = conn.execute(_WAL, {"s": start, "e": end, "db": self.dboid})
        return {(r[0], r[1]): (int(r[2]), float(r[3])) for r in rows}

    def close(self) -> None:
        self.engine.dispose()


def _upgrade(url: str, revision: str) -> None:
    """Migrate the database at `url` to `revision` (alembic), no further."""
    from alembic import command
    from alembic.config import Config

    from orchestrator.store.database import open_engine

    engine = open_engine(url)
    config = Config()
    config.set_main_option("script_location", str(resources.files("orchestrator.store") / "migrations"))
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    finally:
        engine.dispose()


#: What migration `REVISION` changed, undone (its downgrade's statements) on the floor's database.
UNDO = (
    "ALTER TABLE ratchet_runs RESET (fillfactor)",
    "DROP INDEX ix_ratchet_runs_parent",
    "CREATE INDEX ix_ratchet_runs_parent ON ratchet_runs (parent_run_id)",
    "DROP INDEX ix_ratchet_runs_user",
    "CREATE INDEX ix_ratchet_runs_user ON ratchet_runs (user_id, created_at)",
)


def floor_revision() -> str:
    """The revision before `REVISION`: the schema, as 0015 changed it, that the floor runs on."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(resources.files("orchestrator.store") / "migrations"))
    before = script.get_revision(REVISION).down_revision
    assert isinstance(before, str)
    return before


class Sides(NamedTuple):
    """One kind of round on both schemas: the floor's rounds and the head's, paired."""

    floor: list[Written]
    head: list[Written]

    def samples(self, figure: Callable[[Written], float]) -> tuple[list[float], list[float], float]:
        """The floor's and the head's samples of `figure`, and the median of their paired ratios."""
        floor, head = [figure(w) for w in self.floor], [figure(w) for w in self.head]
        return floor, head, median([h / f for f, h in zip(floor, head, strict=True) if f])


def measure(env: BenchEnv, *, runs: int = 30, batches: int = 10, rounds: int = 3) -> Section:
    """The floor's schema against the head's, steps and renewals, interleaved (module docstring)."""
    before = floor_revision()
    sides = {
        "floor": Database(env.fresh_pg_url("updates_floor"), undo=True),
        "head": Database(env.fresh_pg_url("updates_head"), undo=False),
    }
    steps, renewals = Sides([], []), Sides([], [])
    try:
        for i in range(rounds):
            for name in ("floor", "head") if i % 2 == 0 else ("head", "floor"):
                getattr(steps, name).append(sides[name].run_steps(runs, batches))
                getattr(renewals, name).append(sides[name].renewals(runs, RENEWALS))
    finally:
        for db in sides.values():
            db.close()
    setups = {
        "steps": f"PostgreSQL, {runs} runs of {2 * batches + 1} steps in turn",
        "renewals": f"PostgreSQL, {runs} leases held, renewed {RENEWALS} times",
    }
    return _section(steps, renewals, setups, before)


def _section(steps: Sides, renewals: Sides, setups: dict[str, str], before: str) -> Section:
    rows: list[Row] = []
    numbers: dict[str, float] = {}
    figures = [
        ("wal", "WAL per step", steps, lambda w: w.per("wal"), "B", 0),
        ("index_wal", "of it, the run rows' indexes", steps, lambda w: w.per("indexes"), "B", 0),
        ("hot_share", "HOT share of the run rows' updates", steps, lambda w: 100 * w.hot_share, "%", 1),
        ("ms", "Time per step", steps, lambda w: 1000 * w.per("seconds"), "ms", 3),
        ("renewal_wal", "WAL per lease renewed", renewals, lambda w: w.per("wal"), "B", 0),
        ("renewal_hot_share", "HOT share of the lease renewals", renewals, lambda w: 100 * w.hot_share, "%", 1),
    ]
    for key, what, side, figure, unit, digits in figures:
        floor, head, ratio = side.samples(figure)
        setup = setups["steps" if side is steps else "renewals"]
        has_ratio = unit != "%"
        note = "vs the schema before" if has_ratio else ""
        rows.append(Row(f"{what}, schema of {before}", setup, floor, unit, digits=digits))
        rows.append(
            Row(f"{what}, head", setup, head, unit, ratio=ratio if has_ratio else None, ratio_note=note, digits=digits)
        )
        numbers[f"updates_{key}_floor"], numbers[f"updates_{key}"] = median(floor), median(head)
        if has_ratio:
            numbers[f"updates_{key}_ratio"] = ratio
    section = Section(TITLE, rows=rows, numbers=numbers)
    section.notes.append(
        f"Floor: the head's schema with {REVISION} undone (the run rows' storage of {before}), in a database "
        "of its own, rounds "
        f"interleaved with the head's. Renewals: {RENEWALS} of each run's lease. WAL without full-page images. "
        f"Load average when it ended: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)."
    )
    return section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.updates", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="runs whose steps run in turn in each round")
    parser.add_argument("--batches", type=int, default=10, help="tool batches of each run (2 x this + 1 steps)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds on each schema, interleaved")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.json and RESULTS.md are")
    args = parser.parse_args(argv)
    began = time.monotonic()
    with bench_env() as env:
        section = measure(env, runs=args.runs, batches=args.batches, rounds=args.rounds)
    section.seconds = time.monotonic() - began
    for row in section.rows:
        print("  " + " | ".join(row.cells()), file=sys.stderr)
    merge(args.out, section, replaces=lambda title: title == TITLE)
    return 0 if math.isfinite(section.numbers.get("updates_wal", math.nan)) else 1


if __name__ == "__main__":
    sys.exit(main())
