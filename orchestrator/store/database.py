"""Opening the run store's database: URL normalisation, SQLite tuning, migrations.

SQLite runs in WAL mode with a busy timeout, and every write transaction starts with
`BEGIN IMMEDIATE`, so two writers queue on the lock instead of deadlocking on an upgrade from a
read lock (SQLite has no SELECT ... FOR UPDATE). Reads (the store's quick engine) start with a
plain BEGIN: in WAL mode they neither wait for a writer nor hold one up. `PRAGMA synchronous` is
RATCHET_SQLITE_SYNCHRONOUS (FULL by default: a commit survives an OS crash or a power loss).

PostgreSQL uses psycopg 3, and every transaction runs READ COMMITTED whatever the database's
`default_transaction_isolation`: the fan-in reads its members' rows after it waited for the team's
lock and must see what the member that held the lock committed (a snapshot taken earlier would
miss it), and the fenced writes rely on an UPDATE re-checking its guard against the row it waited
for instead of failing with a serialization error. The level is set per transaction
(`BEGIN ISOLATION LEVEL READ COMMITTED`), so it is safe behind a transaction-pooling PgBouncer.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.engine import make_url

from orchestrator.errors import ConfigurationError

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: The values of RATCHET_SQLITE_SYNCHRONOUS (OFF is not offered: it loses commits to an OS crash
#: and can corrupt the database).
SQLITE_SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")
#: The only isolation level Ratchet's PostgreSQL transactions run at (see above).
PG_ISOLATION = "READ COMMITTED"


def normalise_url(url: str) -> str:
    """Use psycopg 3 for plain `postgresql://` URLs (the driver Ratchet installs)."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def open_engine(url: str, *, sqlite_synchronous: str = "FULL", **kwargs: Any) -> Engine:
    """An Engine for the store's URL, tuned for its dialect (`sqlite_synchronous`: SQLite's
    `PRAGMA synchronous`, RATCHET_SQLITE_SYNCHRONOUS)."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigurationError(f"RATCHET_DATABASE_URL is not a database URL: {exc}") from None
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(url, parsed.database, sqlite_synchronous, **kwargs)
    if parsed.get_backend_name() != "postgresql":
        raise ConfigurationError(
            f"RATCHET_DATABASE_URL uses {parsed.get_backend_name()!r}; Ratchet supports sqlite and postgresql"
        )
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 5)
    kwargs.setdefault("max_overflow", 20)
    kwargs.setdefault("isolation_level", PG_ISOLATION)
    return create_engine(url, **kwargs)


def autocommit_is_read_committed(engine: Engine) -> bool:
    """PostgreSQL: whether a statement sent outside a transaction runs READ COMMITTED.

    Such a statement runs at the database's `default_transaction_isolation`, which only a
    session setting could change (and a transaction-pooling PgBouncer does not keep those). On a
    database set to a stricter default, the store sends its single statements in transactions
    pinned to READ COMMITTED instead: one round trip more each (`Store`)."""
    with engine.connect() as conn:
        level = conn.exec_driver_sql("SHOW default_transaction_isolation").scalar()
    return str(level).lower() == PG_ISOLATION.lower()


#: Execution option of the SQLite engine's read-only view: its transactions begin with a plain BEGIN.
_READS = "ratchet_reads"


def open_quick_engine(engine: Engine, *, autocommit: bool = True) -> Engine:
    """The engine for reads and for the claim.

    SQLite: the same pool, its transactions started with a plain BEGIN (the claim, a write, does
    not use it there). PostgreSQL: a second pool, autocommit, so a read or the claim's
    single statement costs one round trip (no BEGIN, COMMIT or ROLLBACK). It is built from the
    engine's URL (so PGOPTIONS, a service file or `?options=` apply to both pools alike) and sets
    nothing on its sessions, so it is safe behind a transaction-pooling PgBouncer: the claim
    turns off synchronous commit for its own transaction only (`statements.CLAIM_PG`). Every
    durable write goes through `engine`.

    No pre-ping: the store retries a read or a claim once when the server dropped its connection,
    so a database restart costs one failed round trip, not a ping before every statement.

    `autocommit=False` (a database whose default isolation is stricter than READ COMMITTED, see
    `autocommit_is_read_committed`): the pool's transactions run READ COMMITTED instead, and the
    store commits each one."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{_READS: True})
    level = "AUTOCOMMIT" if autocommit else PG_ISOLATION
    return create_engine(engine.url, isolation_level=level, pool_pre_ping=False, pool_size=5, max_overflow=20)


def open_lazy_engine(engine: Engine) -> Engine:
    """The engine for writes that need not survive an OS crash: the claim and lease renewals.

    SQLite: a pool of its own at `synchronous=NORMAL`, so these commits do not wait for an fsync
    (as the claim on PostgreSQL does not wait for its WAL flush). Lost in an OS crash, a claim
    leaves the run as it was and the step's own commit, fenced by it, fails; the next synced
    commit flushes the WAL in order, claim first. PostgreSQL: `engine` itself."""
    if engine.dialect.name != "sqlite":
        return engine
    return open_engine(engine.url.render_as_string(hide_password=False), sqlite_synchronous="NORMAL")


def _sqlite_engine(url: str, database: str | None, synchronous: str, **kwargs: Any) -> Engine:
    if not database or database == ":memory:":
        raise ConfigurationError("Ratchet needs a SQLite file that workers share, not an in-memory database")
    synchronous = synchronous.upper()
    if synchronous not in SQLITE_SYNCHRONOUS:
        raise ConfigurationError(
            f"RATCHET_SQLITE_SYNCHRONOUS is {synchronous!r}; use one of {', '.join(SQLITE_SYNCHRONOUS)}"
        )
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module so BEGIN IMMEDIATE below is ours.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READS) else "BEGIN IMMEDIATE")

    return engine


def migrate(engine: Engine) -> None:
    """Apply every pending migration (idempotent; safe from several processes at once on PG)."""
    from alembic import command
    from alembic.config import Config

    script_location = str(resources.files("orchestrator.store") / "migrations")
    config = Config()
    config.set_main_option("script_location", script_location)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Two workers starting together must not both create the tables.
            conn.exec_driver_sql("SELECT pg_advisory_xact_lock(74657)")
        config.attributes["connection"] = conn
        command.upgrade(config, "head")


def is_migrated(engine: Engine) -> bool:
    """True when the store's tables exist."""
    return inspect(engine).has_table("ratchet_runs")


__all__ = [
    "autocommit_is_read_committed",
    "migrate",
    "normalise_url",
    "open_engine",
    "open_quick_engine",
    "is_migrated",
]
