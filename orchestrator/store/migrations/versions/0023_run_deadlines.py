"""Run deadlines: when a run must have ended by, and the index the sweeper reads them by.

- `ratchet_runs.deadline_at`: when its deadline passes (UNIX seconds; `orchestrator.deadlines`);
  NULL: none. `ratchet_runs.run_timeout`: the seconds it was given, which a continue after the
  deadline gives it again. Both nullable without a default: neither database rewrites the table.
- `ix_ratchet_runs_deadline`: (status, deadline_at) of the runs with a deadline only, so the
  sweeper's pass reads the runs still going past theirs without reading those that ended.

Revision ID: 0023_run_deadlines
Revises: 0022_paused_tools
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_run_deadlines"
down_revision = "0022_paused_tools"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ratchet_runs", sa.Column("deadline_at", sa.Float, nullable=True))
    op.add_column("ratchet_runs", sa.Column("run_timeout", sa.Float, nullable=True))
    with_deadline = sa.text("deadline_at IS NOT NULL")
    op.create_index(
        "ix_ratchet_runs_deadline",
        "ratchet_runs",
        ["status", "deadline_at"],
        postgresql_where=with_deadline,
        sqlite_where=with_deadline,
    )


def downgrade() -> None:
    op.drop_index("ix_ratchet_runs_deadline", table_name="ratchet_runs")
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("run_timeout")
        batch.drop_column("deadline_at")
