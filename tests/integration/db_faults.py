"""A real database error on demand: a trigger that aborts every UPDATE of one run's row.

For tests of code that must survive a failed statement (the sweeper, the lease heartbeat) on
SQLite and PostgreSQL alike, without mocking the database."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

FAILURE = "injected failure"


@contextmanager
def failing_updates(engine: Engine, run_id: str) -> Iterator[None]:
    """While inside, every UPDATE of `run_id`'s row (alone or with others) fails."""
    name = f"ratchet_test_fail_{uuid.uuid4().hex[:8]}"
    assert "'" not in run_id
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE UPDATE ON ratchet_runs WHEN OLD.run_id = '{run_id}' "
                f"BEGIN SELECT RAISE(ABORT, '{FAILURE}'); END"
            )
        else:
            conn.exec_driver_sql(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                f"$$ BEGIN RAISE EXCEPTION '{FAILURE}'; END $$"
            )
            conn.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE UPDATE ON ratchet_runs FOR EACH ROW "
                f"WHEN (OLD.run_id = '{run_id}') EXECUTE FUNCTION {name}()"
            )
    try:
        yield
    finally:
        with engine.begin() as conn:
            if conn.dialect.name == "sqlite":
                conn.exec_driver_sql(f"DROP TRIGGER {name}")
            else:
                conn.exec_driver_sql(f"DROP TRIGGER {name} ON ratchet_runs")
                conn.exec_driver_sql(f"DROP FUNCTION {name}()")
