"""Fallback models: where a model step is in its chain, and which model wrote a reply.

- `ratchet_runs.model_index`: the place in its agent's fallback chain of the model the current
  model step calls (`orchestrator.models.fallback`; NULL: 0, the agent's own model). A fallback
  writes it before it calls the next model, so a step taken back after a crash calls the model
  it was trying; a commit and a continue set it back to NULL.
- `ratchet_messages.model`: the model that wrote an assistant message, by its configured id;
  NULL on other roles and on rows written before this migration.

Both nullable without a default: neither database rewrites a table to add them.

Revision ID: 0017_model_fallback
Revises: 0016_requirements
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_model_fallback"
down_revision = "0016_requirements"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ratchet_runs", sa.Column("model_index", sa.SmallInteger, nullable=True))
    op.add_column("ratchet_messages", sa.Column("model", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_messages") as batch:
        batch.drop_column("model")
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("model_index")
