"""Record on each message row the step (seq) and epoch that wrote it.

Two attempts of one step can both write messages (a tool result committed by an attempt whose
lease then expired, and the next attempt's); these columns let an audit tell them apart. Rows
written before this migration keep NULL: which attempt wrote them is not known.

Revision ID: 0003_message_step
Revises: 0002_parent_tool_call
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_message_step"
down_revision = "0002_parent_tool_call"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns with no default: SQLite adds them without rebuilding the table, and
    # PostgreSQL without rewriting it.
    op.add_column("ratchet_messages", sa.Column("seq", sa.Integer, nullable=True))
    op.add_column("ratchet_messages", sa.Column("epoch", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_messages") as batch:
        batch.drop_column("epoch")
        batch.drop_column("seq")
