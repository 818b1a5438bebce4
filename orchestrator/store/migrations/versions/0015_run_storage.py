"""Run-row updates that write fewer index entries (measured by `python -m bench.updates`).

Every step updates its run's row twice (the claim, the commit), and both updates change the
status, which the sweeper's and the listing's indexes hold: PostgreSQL cannot do them in place
(HOT), so each writes a new entry in every index of `ratchet_runs` whose condition the row meets.

- `ix_ratchet_runs_parent` and `ix_ratchet_runs_user` hold only rows that have a parent run or a
  user: a top-level run without a user (most runs) takes no entry in them at each step. Their
  queries compare the column with `=`, which no NULL matches, so both databases still use them.
- PostgreSQL: inserts fill `ratchet_runs`' pages to FILLFACTOR percent, the rest kept for the
  rows' updates, so that an update that changes no indexed column (a worker's heartbeat renewing
  a lease) finds room on the row's own page and is done in place, with no index entry at all. It applies to pages
  written from now on (VACUUM FULL or a dump and restore packs the existing ones again).

A step's own two updates stay non-HOT: the status they change is in the sweep index's key and in
the listing indexes' condition (migration 0007), and PostgreSQL does an update in place only when
no column of any index's key or condition changes. On PostgreSQL the two indexes are built again
in the migration's transaction, which blocks writes to ratchet_runs while they build (about a
second per million runs on a small machine); on a large store, run `ratchet migrate` at a quiet time.

Revision ID: 0015_run_storage
Revises: 0014_sweep_lease
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015_run_storage"
down_revision = "0014_sweep_lease"
branch_labels = None
depends_on = None

#: Percent of a run-row page that inserts fill (`orchestrator/store/tables.py` declares the same).
FILLFACTOR = 80
#: The partial indexes: (name, columns, the column whose rows they hold).
PARTIAL = (
    ("ix_ratchet_runs_parent", ["parent_run_id"], "parent_run_id"),
    ("ix_ratchet_runs_user", ["user_id", "created_at"], "user_id"),
)


def _on_postgresql(sql: str) -> None:
    """Run `sql` on PostgreSQL only (the storage parameter is PostgreSQL's), as a DDL event would."""
    sa.DDL(sql).execute_if(dialect="postgresql")(None, op.get_bind())  # type: ignore[no-untyped-call]


def upgrade() -> None:
    for name, columns, column in PARTIAL:
        held = sa.text(f"{column} IS NOT NULL")
        op.drop_index(name, table_name="ratchet_runs")
        op.create_index(name, "ratchet_runs", columns, postgresql_where=held, sqlite_where=held)
    _on_postgresql(f"ALTER TABLE ratchet_runs SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    _on_postgresql("ALTER TABLE ratchet_runs RESET (fillfactor)")
    for name, columns, _ in PARTIAL:
        op.drop_index(name, table_name="ratchet_runs")
        op.create_index(name, "ratchet_runs", columns)
