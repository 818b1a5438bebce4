"""What paused runs ask of a person: `ratchet_requirements`.

- One row per paused tool call (or spent budget) of a run, written in the commit that moves the
  run to PAUSED, and decided once (`store/paused.py`): its call, what it asks, its deadline
  and policy, and the decision with who made it and when.
- `ix_ratchet_requirements_deadline` holds pending rows only: the sweeper's search for deadlines
  that passed reads nothing else.

A new table: neither database rewrites anything.

Revision ID: 0016_requirements
Revises: 0015_run_storage
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_requirements"
down_revision = "0015_run_storage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ratchet_requirements",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("ratchet_runs.run_id"), nullable=False),
        sa.Column("root_run_id", sa.String(64), nullable=False),
        sa.Column("agent_name", sa.String(256), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("pause_type", sa.String(32), nullable=False),
        sa.Column("tool_call_id", sa.String(128), nullable=True),
        sa.Column("tool_name", sa.String(256), nullable=True),
        sa.Column("tool_args", sa.Text, nullable=True),
        sa.Column("detail", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("deadline_at", sa.Float, nullable=True),
        sa.Column("on_timeout", sa.String(16), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("decision", sa.Text, nullable=True),
        sa.Column("decided_by", sa.String(128), nullable=True),
        sa.Column("decided_at", sa.Float, nullable=True),
    )
    op.create_index("ix_ratchet_requirements_run", "ratchet_requirements", ["run_id", "created_at"])
    op.create_index("ix_ratchet_requirements_root", "ratchet_requirements", ["root_run_id", "status"])
    pending = sa.text("status = 'pending'")
    op.create_index(
        "ix_ratchet_requirements_deadline",
        "ratchet_requirements",
        ["deadline_at"],
        postgresql_where=pending,
        sqlite_where=pending,
    )


def downgrade() -> None:
    op.drop_table("ratchet_requirements")
