"""Link a member run to the team's delegation call that started it.

A team's tool batch that delegates writes one child run per member with `parent_tool_call_id`
set to the leader's tool call id; the fan-in groups the members' answers by it.

Revision ID: 0002_parent_tool_call
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_parent_tool_call"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column with no default: SQLite adds it without rebuilding the table.
    op.add_column("ratchet_runs", sa.Column("parent_tool_call_id", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("parent_tool_call_id")
