"""Webhooks: where a run's stops are told, and the outbox of those deliveries.

- `ratchet_runs.webhook`: the URL its producer gave (`orchestrator.webhooks`); NULL: none.
  Nullable without a default: neither database rewrites the table to add it.
- `ratchet_webhook_deliveries`: one row per stop (COMPLETED, ERROR, CANCELLED, PAUSED) of a run
  with a webhook, written in the transaction of the move, delivered and retried by the sweeper.

Revision ID: 0021_webhooks
Revises: 0020_schedules
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_webhooks"
down_revision = "0020_schedules"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ratchet_runs", sa.Column("webhook", sa.Text, nullable=True))
    op.create_table(
        "ratchet_webhook_deliveries",
        sa.Column("delivery_id", sa.String(128), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("agent_name", sa.String(256), nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("run_status", sa.String(16), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("content", sa.Text, nullable=True),
        sa.Column("error_type", sa.String(128), nullable=True),
        sa.Column("error_message", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.Float, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("delivered_at", sa.Float, nullable=True),
    )
    op.create_index("ix_ratchet_webhook_deliveries_run", "ratchet_webhook_deliveries", ["run_id"])
    unsent = sa.text("state = 'pending'")
    op.create_index(
        "ix_ratchet_webhook_deliveries_due",
        "ratchet_webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=unsent,
        sqlite_where=unsent,
    )


def downgrade() -> None:
    op.drop_table("ratchet_webhook_deliveries")
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("webhook")
