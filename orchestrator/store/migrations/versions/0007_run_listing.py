"""Indexes for listing runs newest first, filtered by status and agent (`Client.list_runs`), and
for finding old stopped runs to prune (`Client.prune`).

- `ix_ratchet_runs_status_listing` (status, created_at, run_id): a status's runs in the order a
  listing pages through them; a listing without a status filter reads each status's range and
  merges them (`store/listing.py`), and prune reads the oldest of each stopped status.
- `ix_ratchet_runs_agent_listing` (agent_name, status, created_at, run_id): the same within one
  agent, so "this agent's failed runs, newest first" reads 50 index entries, not the agent's runs.

Both leave out QUEUED and RUNNING runs: a run moves between those two at every step, and its
row's update would otherwise add an entry to each index every time (on PostgreSQL, where the
sweeper's index on status already keeps that update from being HOT; on SQLite, because the status
is in them). A run enters them when it settles (COMPLETED, ERROR, CANCELLED, WAITING, PAUSED).
QUEUED and RUNNING runs are few, and listed through the sweeper's (status, publish_after) index.
A filter on a session or a user uses the indexes those columns have (migration 0006).

On PostgreSQL the indexes are built in the migration's transaction, which blocks writes to
ratchet_runs while they build (about a second per million runs on a small machine); on a large
store, run `ratchet migrate` at a quiet time.

Revision ID: 0007_run_listing
Revises: 0006_sessions_history
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_run_listing"
down_revision = "0006_sessions_history"
branch_labels = None
depends_on = None


#: The indexes' condition; `orchestrator/store/listing.py` repeats it in each query that uses them.
SETTLED = "status NOT IN ('QUEUED', 'RUNNING')"


def upgrade() -> None:
    settled = sa.text(SETTLED)
    op.create_index(
        "ix_ratchet_runs_status_listing",
        "ratchet_runs",
        ["status", "created_at", "run_id"],
        postgresql_where=settled,
        sqlite_where=settled,
    )
    op.create_index(
        "ix_ratchet_runs_agent_listing",
        "ratchet_runs",
        ["agent_name", "status", "created_at", "run_id"],
        postgresql_where=settled,
        sqlite_where=settled,
    )


def downgrade() -> None:
    op.drop_index("ix_ratchet_runs_agent_listing", table_name="ratchet_runs")
    op.drop_index("ix_ratchet_runs_status_listing", table_name="ratchet_runs")
