"""What the Prometheus metrics of `ratchet api` read (`orchestrator/store/metrics.py`).

- `ratchet_messages.step_started_at`: when the step whose commit wrote the row was claimed, on
  the messages a step's own commit carries; the step's duration is the row's `created_at` minus
  it. Older rows keep NULL: their steps' durations are not known.
- `ix_ratchet_messages_created` and `ix_ratchet_events_at`: the rows written since a time, read
  by every scrape (the last minute or so of them), not the whole tables.
- `ratchet_metric_totals`: the counters' values up to a time, so that a scrape sums only the rows
  written since, and a prune does not take a counter down. Its mark row starts at time 0: the
  first scrape after this migration counts every row already stored, once.

On PostgreSQL the indexes are built in the migration's transaction, which blocks writes to
ratchet_messages and ratchet_events while they build (seconds per million rows); on a large
store, run `ratchet migrate` at a quiet time.

Revision ID: 0010_metrics
Revises: 0009_run_trace
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_metrics"
down_revision = "0009_run_trace"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column with no default: neither database rewrites the table to add it.
    op.add_column("ratchet_messages", sa.Column("step_started_at", sa.Float, nullable=True))
    op.create_index("ix_ratchet_messages_created", "ratchet_messages", ["created_at"])
    op.create_index("ix_ratchet_events_at", "ratchet_events", ["at"])
    totals = op.create_table(
        "ratchet_metric_totals",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("agent", sa.String(256), nullable=False),
        sa.Column("label", sa.String(64), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("name", "agent", "label", name="pk_ratchet_metric_totals"),
    )
    # The mark: the counters hold the rows written up to this time (none yet).
    op.bulk_insert(totals, [{"name": "mark", "agent": "", "label": "", "value": 0.0}])


def downgrade() -> None:
    op.drop_table("ratchet_metric_totals")
    op.drop_index("ix_ratchet_events_at", table_name="ratchet_events")
    op.drop_index("ix_ratchet_messages_created", table_name="ratchet_messages")
    with op.batch_alter_table("ratchet_messages") as batch:
        batch.drop_column("step_started_at")
