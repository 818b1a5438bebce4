"""Streamed runs: the `stream` flag on a run, and the table that carries their live events.

A run started with `stream=True` has its steps publish live events (text deltas, step restarts)
beside the durable ones derived from its rows; on a deployment without Redis they go to
`ratchet_deltas`, written without waiting for the disk and deleted some time after they were
written (RATCHET_STREAM_TTL). Other runs write nothing there.

Revision ID: 0004_run_stream
Revises: 0003_message_step
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_run_stream"
down_revision = "0003_message_step"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A constant server default: SQLite adds the column without rebuilding the table, and
    # PostgreSQL without rewriting it.
    op.add_column("ratchet_runs", sa.Column("stream", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_table(
        "ratchet_deltas",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("event_id", sa.String(96), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_ratchet_deltas_run", "ratchet_deltas", ["run_id", "id"])
    op.create_index("ix_ratchet_deltas_created", "ratchet_deltas", ["created_at"])


def downgrade() -> None:
    op.drop_table("ratchet_deltas")
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("stream")
