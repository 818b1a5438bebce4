"""What the rate and latency metrics read (`orchestrator/store/metrics.py`, issue 27).

- `ratchet_runs.queued_at`: when the step a worker claimed was queued. The claim sets it from
  the run's `updated_at` before the claim overwrites it (the time of the move to QUEUED); NULL on
  a claim of a RUNNING run whose lease expired, and on rows claimed before.
- `ratchet_messages.step_queued_at`: that time, on the messages a step's own commit carries (as
  `step_started_at` is): the step's queue wait is `step_started_at` minus it.
- `ratchet_messages.duration`: seconds the call took, on a model step's reply (the model call)
  and on a tool result (the tool call: only for a tool the agent has).
- `ratchet_messages.time_to_first_token`: seconds from a streamed model call to its first text.
- `ix_ratchet_runs_created`: the runs started since a time, read by every scrape (runs started).
- `ratchet_metric_totals.label` grows to 320 characters: a label holds a model id or tool name.

Nullable columns with no default: neither database rewrites a table to add them. On PostgreSQL
the index is built in the migration's transaction, which blocks writes to ratchet_runs while it
builds (seconds per million runs): on a large store, run `ratchet migrate` at a quiet time.
Older rows keep NULL: they are in none of the new histograms.

Revision ID: 0018_rates_latencies
Revises: 0017_model_fallback
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_rates_latencies"
down_revision = "0017_model_fallback"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ratchet_runs", sa.Column("queued_at", sa.Float, nullable=True))
    op.add_column("ratchet_messages", sa.Column("step_queued_at", sa.Float, nullable=True))
    op.add_column("ratchet_messages", sa.Column("duration", sa.Float, nullable=True))
    op.add_column("ratchet_messages", sa.Column("time_to_first_token", sa.Float, nullable=True))
    op.create_index("ix_ratchet_runs_created", "ratchet_runs", ["created_at"])
    _label(sa.String(64), sa.String(320))


def downgrade() -> None:
    # The totals of the new metrics (labels that may not fit 64 characters): nothing before reads them.
    totals = sa.table("ratchet_metric_totals", sa.column("name", sa.String))
    new = ["started", "queue", "model_call", "first_token", "tool", "run"]
    op.execute(totals.delete().where(totals.c.name.in_(new)))
    _label(sa.String(320), sa.String(64))
    op.drop_index("ix_ratchet_runs_created", table_name="ratchet_runs")
    with op.batch_alter_table("ratchet_messages") as batch:
        for column in ("time_to_first_token", "duration", "step_queued_at"):
            batch.drop_column(column)
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("queued_at")


def _label(was: sa.String, becomes: sa.String) -> None:
    """Widen (or narrow) the totals' label: in place on PostgreSQL (a wider VARCHAR rewrites
    nothing); SQLite copies the table, which holds a few hundred rows."""
    with op.batch_alter_table("ratchet_metric_totals") as batch:
        batch.alter_column("label", type_=becomes, existing_type=was, existing_nullable=False)
