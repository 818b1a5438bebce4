"""The benchmark's private world: its own PostgreSQL database, SQLite file, Redis queues and
settings, created at start and removed at the end, so a benchmark never touches test data."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text

from orchestrator.settings import Settings
from orchestrator.store import forget_stores

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
DATABASES = ("pg", "sqlite")
#: SQLite's durability level for Ratchet and the floor alike (RATCHET_SQLITE_SYNCHRONOUS): set
#: BENCH_SQLITE_SYNCHRONOUS=NORMAL to measure what FULL, the default, costs.
SQLITE_SYNCHRONOUS = os.environ.get("BENCH_SQLITE_SYNCHRONOUS", "FULL").upper()


@dataclass
class BenchEnv:
    """Where the benchmarks run: URLs, a scratch folder, and a tag that names their queues."""

    tag: str
    tmp: Path
    pg_url: str
    sqlite_url: str
    redis_url: str = REDIS_URL
    _extra_dbs: list[str] = field(default_factory=list)

    def db_url(self, db: str) -> str:
        """The database URL for "pg" or "sqlite"."""
        return self.pg_url if db == "pg" else self.sqlite_url

    def fresh_sqlite_url(self, name: str) -> str:
        """A new SQLite file (for a measurement that must start from an empty store)."""
        return f"sqlite:///{self.tmp / (name + '.db')}"

    def fresh_pg_url(self, name: str) -> str:
        """A new private PostgreSQL database, dropped with the environment."""
        db = f"bench_{self.tag}_{name}"
        _admin(f'CREATE DATABASE "{db}"')
        self._extra_dbs.append(db)
        return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + db

    def fresh_url(self, db: str, name: str) -> str:
        """A new, empty store on "pg" or "sqlite"."""
        return self.fresh_pg_url(name) if db == "pg" else self.fresh_sqlite_url(name)

    def settings(self, db_url: str, name: str, **overrides: Any) -> Settings:
        """Settings with this benchmark's own queues (`bench.<tag>.<name>.*`)."""
        prefix = f"bench.{self.tag}.{name}"
        values: dict[str, Any] = dict(
            database_url=db_url, broker_url=self.redis_url, model_queue=f"{prefix}.model",
            tools_queue=f"{prefix}.tools", control_queue=f"{prefix}.control", sqlite_synchronous=SQLITE_SYNCHRONOUS,
        )  # fmt: skip
        values.update(overrides)
        return Settings.model_validate(values)

    def queue(self, name: str) -> str:
        """A queue name of this benchmark run."""
        return f"bench.{self.tag}.{name}"


def settings_env(settings: Settings) -> dict[str, str]:
    """The RATCHET_* variables that reproduce `settings` in a worker subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    for name, value in settings.model_dump().items():
        if value is None:  # unset: "None" would be read as a value (a limit, a URL)
            continue
        env["RATCHET_" + name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def _admin(sql: str) -> None:
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()


@contextmanager
def bench_env() -> Iterator[BenchEnv]:
    """Create the private databases and scratch folder; drop them afterwards."""
    tag = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix=f"ratchet-bench-{tag}-"))
    pg_db = f"bench_{tag}"
    redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    _admin(f'CREATE DATABASE "{pg_db}"')
    env = BenchEnv(
        tag=tag, tmp=tmp, pg_url=PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + pg_db,
        sqlite_url=f"sqlite:///{tmp / 'ratchet.db'}",
    )  # fmt: skip
    try:
        yield env
    finally:
        forget_stores()
        for db in [pg_db, *env._extra_dbs]:
            _admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        r = redis.Redis.from_url(REDIS_URL)
        keys = list(r.scan_iter(match=f"*bench.{tag}.*", count=1000))
        if keys:
            r.delete(*keys)
        if not os.environ.get("BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
