"""A paused call's tool as it paused (issue 28): `ratchet_requirements.definition_hash` and
`tool_digest`.

The hash of the definition the pausing worker served, and a digest of the paused tool (the
arguments the model sees, what a call of it asks, the fields a person fills in:
`orchestrator.paused_tools`), so that a decision made after a deploy changed the tool is refused
rather than applied to another tool. Nullable with no default: neither database rewrites the
table to add them. Older rows, and budget pauses, keep NULL (their tool is compared by name and
by what it asks only).

Revision ID: 0022_paused_tools
Revises: 0021_webhooks
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022_paused_tools"
down_revision = "0021_webhooks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ratchet_requirements", sa.Column("definition_hash", sa.String(64), nullable=True))
    op.add_column("ratchet_requirements", sa.Column("tool_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_requirements") as batch:
        batch.drop_column("tool_digest")
        batch.drop_column("definition_hash")
