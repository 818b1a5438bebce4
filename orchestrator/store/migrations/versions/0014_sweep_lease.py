"""Leases of jobs one process of the fleet does at a time: the sweeper's first.

- `ratchet_leases(name, owner, expires_at, renewed_at)`: one row per job (`store/leases.py`). Every
  worker runs a sweeper thread; each pass first takes or renews the lease "sweeper", so one of them
  acts at a time, and another takes over once its holder stops renewing (`orchestrator.sweeping`).

A new table: neither database rewrites anything.

Revision ID: 0014_sweep_lease
Revises: 0013_agent_catalog
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_sweep_lease"
down_revision = "0013_agent_catalog"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ratchet_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("owner", sa.String(256), nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("renewed_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ratchet_leases")
