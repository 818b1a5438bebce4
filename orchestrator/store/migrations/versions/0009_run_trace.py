"""The trace a run's steps join.

- `ratchet_runs.trace_context`: the W3C traceparent of the span the run's producer started it
  under (`orchestrator.tracing`); for a team's member run, the span of the leader's step that
  delegated to it. NULL when its producer traced nothing.

Rows written before this migration read as NULL: their steps' spans join a trace derived from
the run id, the same on every worker.

Revision ID: 0009_run_trace
Revises: 0008_run_priority
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_run_trace"
down_revision = "0008_run_priority"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, without a default: neither database rewrites the table to add it.
    op.add_column("ratchet_runs", sa.Column("trace_context", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("trace_context")
