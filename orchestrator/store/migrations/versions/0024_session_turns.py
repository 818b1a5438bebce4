"""Session turns: runs of one session taken one at a time (`serialize_session_runs`).

- `ratchet_runs.wakes_session`: a run of its session waits behind this one; when it stops, the
  first run waiting is given its turn and this is cleared (`orchestrator.store.turns`). NULL:
  none waits. Nullable without a default: neither database rewrites the table to add it.
- `ix_ratchet_runs_wakes`: those runs by session, for the sweeper's pass; partial, so no other
  run has an entry and no other write touches it.

Revision ID: 0024_session_turns
Revises: 0023_run_deadlines
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024_session_turns"
down_revision = "0023_run_deadlines"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ratchet_runs", sa.Column("wakes_session", sa.Boolean, nullable=True))
    op.create_index(
        "ix_ratchet_runs_wakes",
        "ratchet_runs",
        ["session_id"],
        postgresql_where=sa.text("wakes_session"),
        sqlite_where=sa.text("wakes_session = 1"),  # as SQLite's queries write the condition
    )


def downgrade() -> None:
    op.drop_index("ix_ratchet_runs_wakes", table_name="ratchet_runs")
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("wakes_session")
