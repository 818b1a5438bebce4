"""A run's priority.

- `ratchet_runs.priority`: the priority its producer started it with, 0-9, higher first (NULL
  when none was given: the lowest, as 0). Every step of the run is published with it
  (`orchestrator.routing`), and a team's member runs and a fork take their run's.

Rows written before this migration read as no priority.

Revision ID: 0008_run_priority
Revises: 0007_run_listing
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_run_priority"
down_revision = "0007_run_listing"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable without a default: neither database rewrites the table to add it.
    op.add_column("ratchet_runs", sa.Column("priority", sa.SmallInteger, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("priority")
