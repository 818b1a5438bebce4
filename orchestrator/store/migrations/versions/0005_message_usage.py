"""Record on each assistant message the tokens its model call used, and their cost.

Rows written before this migration keep NULL in every new column: their usage is unknown, and a
total over them says so (None) rather than counting them as zero (`orchestrator.usage`).

Revision ID: 0005_message_usage
Revises: 0004_run_stream
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_message_usage"
down_revision = "0004_run_stream"
branch_labels = None
depends_on = None

_TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "reasoning_tokens")


def upgrade() -> None:
    # Nullable columns with no default: SQLite adds them without rebuilding the table, and
    # PostgreSQL without rewriting it.
    for name in _TOKENS:
        op.add_column("ratchet_messages", sa.Column(name, sa.Integer, nullable=True))
    op.add_column("ratchet_messages", sa.Column("cost", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_messages") as batch:
        batch.drop_column("cost")
        for name in reversed(_TOKENS):
            batch.drop_column(name)
