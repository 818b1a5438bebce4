"""Migration 0015: the run rows' parent and user indexes hold only the rows that have a parent or a
user, so that a step of any other run writes no entry in them; on PostgreSQL the run rows' pages
keep a fifth free for updates done in place. The reads of those columns still use the indexes, and
the migration goes back down to the indexes as they were."""

from __future__ import annotations

from importlib import resources

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

from orchestrator.store import Store
from orchestrator.store.database import open_engine

PARTIAL = {"ix_ratchet_runs_parent": "parent_run_id IS NOT NULL", "ix_ratchet_runs_user": "user_id IS NOT NULL"}


def migrate(engine: Engine, how: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(resources.files("orchestrator.store") / "migrations"))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        getattr(command, how)(config, revision)


def definitions(engine: Engine) -> dict[str, str]:
    """The CREATE INDEX statement of each index of ratchet_runs, as the database keeps it."""
    postgres = engine.dialect.name == "postgresql"
    query = (
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'ratchet_runs'"
        if postgres
        else "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'ratchet_runs'"
    )
    with engine.connect() as conn:
        return {name: sql or "" for name, sql in conn.execute(text(query))}


def storage(engine: Engine) -> list[str] | None:
    """PostgreSQL: ratchet_runs' storage parameters (None: none set); SQLite has none."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn:
        return conn.execute(text("SELECT reloptions FROM pg_class WHERE relname = 'ratchet_runs'")).scalar()


def test_the_migration_makes_the_parent_and_user_indexes_partial_and_goes_back_down(old_database: str) -> None:
    engine = open_engine(old_database)
    try:
        # Given a database at the revision before, whose run indexes hold every row
        migrate(engine, "upgrade", "0012_run_request")
        assert not any(" WHERE " in definitions(engine)[name].upper() for name in PARTIAL)
        assert storage(engine) is None

        # When it is migrated up: the two indexes hold only rows that have the column, and
        # PostgreSQL's run-row pages keep a fifth free
        migrate(engine, "upgrade", "0015_run_storage")
        after = definitions(engine)
        for name, condition in PARTIAL.items():
            assert condition.upper() in after[name].upper().replace("(", "").replace(")", ""), after[name]
        if engine.dialect.name == "postgresql":
            assert storage(engine) == ["fillfactor=80"]

        # Then down again: as they were
        migrate(engine, "downgrade", "-1")
        assert not any(" WHERE " in definitions(engine)[name].upper() for name in PARTIAL)
        assert storage(engine) is None
    finally:
        engine.dispose()


def test_reads_by_parent_and_by_user_still_use_their_indexes(db_url: str) -> None:
    store = Store.open(db_url)
    postgres = store.engine.dialect.name == "postgresql"
    explain = "EXPLAIN " if postgres else "EXPLAIN QUERY PLAN "
    reads = {
        "ix_ratchet_runs_parent": "SELECT run_id FROM ratchet_runs WHERE parent_run_id = :v ORDER BY created_at",
        "ix_ratchet_runs_user": "SELECT run_id FROM ratchet_runs WHERE user_id = :v ORDER BY created_at DESC LIMIT 50",
    }
    with store.engine.connect() as conn:
        if postgres:  # an empty table: without this a scan of it is as cheap as any index
            conn.execute(text("SET enable_seqscan = off"))
        for index, sql in reads.items():
            plan = " ".join(str(row[-1]) for row in conn.execute(text(explain + sql), {"v": "someone"}))
            assert index in plan, plan
