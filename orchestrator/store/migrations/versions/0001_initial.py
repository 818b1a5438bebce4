"""Initial schema: sessions, runs, append-only messages, at-most-once tool starts, events.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ratchet_sessions",
        sa.Column("session_id", sa.String(128), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "ratchet_runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("session_id", sa.String(128), sa.ForeignKey("ratchet_sessions.session_id"), nullable=False),
        sa.Column("agent_name", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("parent_run_id", sa.String(64)),
        sa.Column("forked_from", sa.String(64)),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("next_step", sa.String(16)),
        sa.Column("n_messages", sa.Integer, nullable=False),
        sa.Column("system_message", sa.Text),
        sa.Column("lease_owner", sa.String(255)),
        sa.Column("lease_expires_at", sa.Float),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("retries", sa.Integer, nullable=False),
        sa.Column("publish_after", sa.Float),
        sa.Column("content", sa.Text),
        sa.Column("error_type", sa.String(128)),
        sa.Column("error_message", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_ratchet_runs_session", "ratchet_runs", ["session_id", "created_at"])
    op.create_index("ix_ratchet_runs_parent", "ratchet_runs", ["parent_run_id"])
    op.create_index("ix_ratchet_runs_sweep", "ratchet_runs", ["status", "publish_after"])
    op.create_table(
        "ratchet_messages",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("ratchet_runs.run_id"), nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text),
        sa.Column("tool_calls", sa.Text),
        sa.Column("tool_call_id", sa.String(128)),
        sa.Column("tool_name", sa.String(256)),
        sa.Column("tool_args", sa.Text),
        sa.Column("tool_call_error", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "idx", name="pk_ratchet_messages"),
    )
    op.create_index("ux_ratchet_messages_tool_result", "ratchet_messages", ["run_id", "tool_call_id"], unique=True)
    op.create_table(
        "ratchet_tool_starts",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("ratchet_runs.run_id"), nullable=False),
        sa.Column("tool_call_id", sa.String(128), nullable=False),
        sa.Column("tool_name", sa.String(256), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "tool_call_id", name="pk_ratchet_tool_starts"),
    )
    op.create_table(
        "ratchet_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("seq", sa.Integer),
        sa.Column("detail", sa.Text),
    )
    op.create_index("ix_ratchet_events_run", "ratchet_events", ["run_id", "id"])


def downgrade() -> None:
    for table in ("ratchet_events", "ratchet_tool_starts", "ratchet_messages", "ratchet_runs", "ratchet_sessions"):
        op.drop_table(table)
