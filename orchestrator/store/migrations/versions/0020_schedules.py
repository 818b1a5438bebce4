"""Schedules: agents run on a cron schedule in a time zone (`orchestrator.schedules`).

- `ratchet_schedules`: one row per schedule (its agent, cron, zone, input, session and user),
  with `next_at`, the next tick due, which each sweeper pass reads through
  `ix_ratchet_schedules_next`, and the last tick fired with its run.

A new table: neither database rewrites anything.

Revision ID: 0020_schedules
Revises: 0019_cache_write_tokens
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_schedules"
down_revision = "0019_cache_write_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ratchet_schedules",
        sa.Column("schedule_id", sa.String(40), primary_key=True),
        sa.Column("agent_name", sa.String(256), nullable=False),
        sa.Column("cron", sa.String(128), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("input", sa.Text, nullable=False),
        sa.Column("session_id", sa.String(128), nullable=True),
        sa.Column("user_id", sa.String(128), nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("next_at", sa.Float, nullable=False),
        sa.Column("last_tick", sa.Float, nullable=True),
        sa.Column("last_run_id", sa.String(64), nullable=True),
    )
    op.create_index("ix_ratchet_schedules_next", "ratchet_schedules", ["next_at"])


def downgrade() -> None:
    op.drop_table("ratchet_schedules")
