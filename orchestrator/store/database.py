"""Opening the run store's database: URL normalisation, SQLite tuning, migrations.

SQLite runs in WAL mode with a busy timeout, and every write transaction starts with
`BEGIN IMMEDIATE`, so two writers queue on the lock instead of deadlocking on an upgrade from a
read lock (SQLite has no SELECT ... FOR UPDATE). Reads (on an engine with `SQLITE_READS` set)
start with a plain BEGIN: in WAL mode they neither wait for a writer nor hold one up. `PRAGMA
synchronous` is RATCHET_SQLITE_SYNCHRONOUS (FULL by default: a commit survives an OS crash or a
power loss).

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

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url

from orchestrator.errors import ConfigurationError

SQLITE_BUSY_TIMEOUT_MS = 30_000
#: The values of RATCHET_SQLITE_SYNCHRONOUS (OFF is not offered: it loses commits to an OS crash
#: and can corrupt the database).
SQLITE_SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")
#: The only isolation level Ratchet's PostgreSQL transactions run at (see above).
PG_ISOLATION = "READ COMMITTED"
#: What installs the PostgreSQL driver (psycopg 3): SQLite users need none, so it is an extra.
POSTGRES_EXTRA = "ratchet-agents[postgres]"


def normalise_url(url: str) -> str:
    """Use psycopg 3 for plain `postgresql://` URLs (the driver the `postgres` extra installs)."""
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
    try:
        return create_engine(url, **kwargs)
    except ModuleNotFoundError as exc:  # the driver is an extra: SQLite needs none
        raise ConfigurationError(
            f"RATCHET_DATABASE_URL is a PostgreSQL URL, and its driver {exc.name or ''} is not installed: "
            f"pip install '{POSTGRES_EXTRA}'"
        ) from None


def autocommit_is_read_committed(engine: Engine) -> bool:
    """PostgreSQL: whether a statement sent outside a transaction runs READ COMMITTED.

    Such a statement runs at the database's `default_transaction_isolation`, which only a
    session setting could change (and a transaction-pooling PgBouncer does not keep those). On a
    database set to a stricter default, the store sends its single statements in transactions
    pinned to READ COMMITTED instead: one round trip more each (`PostgresBackend`)."""
    with engine.connect() as conn:
        level = conn.exec_driver_sql("SHOW default_transaction_isolation").scalar()
    return str(level).lower() == PG_ISOLATION.lower()


#: Execution option of the SQLite engine's read-only view (`SqliteBackend.quick_engine`): its
#: transactions begin with a plain BEGIN.
SQLITE_READS = "ratchet_reads"


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
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(SQLITE_READS) else "BEGIN IMMEDIATE")

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


def revisions(engine: Engine) -> tuple[str | None, str]:
    """The database's migration revision (None: no Ratchet tables) and the latest one, for a
    health check: equal when `ratchet migrate` has nothing left to do."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(resources.files("orchestrator.store") / "migrations"))
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    head = script.get_current_head()
    assert head is not None  # the package ships its migrations
    return current, head


def upgrade(url: str) -> str:
    """`ratchet migrate`: apply every pending migration to the database at `url`; its URL with
    the password hidden, to say which."""
    engine = open_engine(url)
    try:
        migrate(engine)
        return engine.url.render_as_string(hide_password=True)
    finally:
        engine.dispose()


def shown_url(url: str) -> str:
    """The database URL with its password hidden: what a message may show."""
    return make_url(url).render_as_string(hide_password=True)


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite URL (None for another database, or SQLite in memory)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    return parsed.database or None


def probe(url: str, *, timeout: float) -> tuple[str | None, str]:
    """A health check's look at the database at `url`: connect (giving up after `timeout`
    seconds where there is a server to wait for), run a query, and read its migration revision
    and the latest one (`revisions`). Raises what the connection or the query raised."""
    engine = checking_engine(url, timeout=timeout)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return revisions(engine)
    finally:
        engine.dispose()


def checking_engine(url: str, *, timeout: float) -> Engine:
    """An engine for a health check: where there is a server to wait for, a connection gives up
    after `timeout` seconds (SQLite has none)."""
    extra: dict[str, Any] = {}
    if make_url(url).get_backend_name() != "sqlite":
        extra["connect_args"] = {"connect_timeout": max(1, round(timeout))}
    return open_engine(url, **extra)


def is_migrated(engine: Engine) -> bool:
    """True when the store's tables exist."""
    return inspect(engine).has_table("ratchet_runs")


def open_migrated(url: str, *, auto_migrate: bool, sqlite_synchronous: str = "FULL") -> Engine:
    """An engine for `url` whose tables are at the latest migration: migrated here when
    `auto_migrate`, else a ConfigurationError if they do not exist."""
    engine = open_engine(url, sqlite_synchronous=sqlite_synchronous)
    if auto_migrate:
        migrate(engine)
    elif not is_migrated(engine):
        raise ConfigurationError(f"the database has no Ratchet tables; run `ratchet migrate` first ({engine.url!r})")
    return engine


__all__ = [
    "PG_ISOLATION",
    "SQLITE_READS",
    "autocommit_is_read_committed",
    "is_migrated",
    "migrate",
    "normalise_url",
    "open_engine",
    "open_migrated",
    "revisions",
]
