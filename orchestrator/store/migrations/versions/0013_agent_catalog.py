"""The agent catalog, and the definition each run started with.

- `ratchet_agent_catalog`: one row per definition workers serve, keyed by (name,
  definition_hash) so that two versions of one agent coexist, with the kind, the definition as
  canonical JSON, and when a worker first and last said it serves it (`orchestrator.catalog`).
- `ratchet_runs.definition_hash`: the hash of the definition a run started with. Rows written
  before this migration read as NULL, as do runs whose producer found no definition.

Revision ID: 0013_agent_catalog
Revises: 0012_run_request
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_agent_catalog"
down_revision = "0012_run_request"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ratchet_agent_catalog",
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("definition_hash", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("definition", sa.Text(), nullable=False),
        sa.Column("first_seen", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", "definition_hash", name="pk_ratchet_agent_catalog"),
    )
    # Nullable, without a default: neither database rewrites the table to add it.
    op.add_column("ratchet_runs", sa.Column("definition_hash", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("definition_hash")
    op.drop_table("ratchet_agent_catalog")
