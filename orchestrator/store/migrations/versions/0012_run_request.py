"""What a run's start asked for, so that a start sent again with another request is refused.

- `ratchet_runs.request_digest`: SHA-256 (hex) of the input and session_state of the start that
  wrote the run (`orchestrator.idempotency`). A start sent again under the run's id (a reused
  Idempotency-Key, a retried `Client.start`) is the same start only if its digest matches.

Rows written before this migration, and runs no start writes (forks, member runs), read as
NULL: a repeat of them is compared by its input alone, as before.

Revision ID: 0012_run_request
Revises: 0011_session_owner
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_run_request"
down_revision = "0011_session_owner"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, without a default: neither database rewrites the table to add it.
    op.add_column("ratchet_runs", sa.Column("request_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("request_digest")
