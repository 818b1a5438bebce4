"""Session history, session state and user ids.

- `ratchet_runs.user_id` and `ratchet_sessions.user_id`: who a run and a session belong to, as
  every producer passes it (NULL when none was given).
- `ratchet_runs.history`: which earlier runs of its session a run's context includes, as JSON
  `[[run_id, n_messages], ...]`, fixed when its first step is claimed (NULL until then, or when
  the agent adds no history) so that a retry, a recovery or a continue builds the same prompt.
- `ratchet_sessions.session_state`: the session's state (a JSON object) that tools read and
  change through `ToolContext`; NULL until something sets it.

Rows written before this migration read as no user, no history and no state.

Revision ID: 0006_sessions_history
Revises: 0005_message_usage
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_sessions_history"
down_revision = "0005_message_usage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns without defaults: neither database rewrites the table to add them.
    op.add_column("ratchet_runs", sa.Column("user_id", sa.String(128), nullable=True))
    op.add_column("ratchet_runs", sa.Column("history", sa.Text, nullable=True))
    op.add_column("ratchet_sessions", sa.Column("user_id", sa.String(128), nullable=True))
    op.add_column("ratchet_sessions", sa.Column("session_state", sa.Text, nullable=True))
    op.create_index("ix_ratchet_runs_user", "ratchet_runs", ["user_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_ratchet_runs_user", table_name="ratchet_runs")
    with op.batch_alter_table("ratchet_sessions") as batch:
        batch.drop_column("session_state")
        batch.drop_column("user_id")
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("history")
        batch.drop_column("user_id")
