"""Deploys: the definition each step ran on, and a definition a person accepted for a run.

- `ratchet_messages.definition_hash`: the definition hash of the worker whose step wrote the
  row (`orchestrator.catalog`), on every row a step writes; NULL on rows no step wrote (a run's
  input, a continue's message, a fan-in's results) and on older rows.
- `ratchet_runs.accepted_definition`: a definition a continue accepted for the run although
  it changed what the run's next step depends on (`continue_run(accept_definition=...)`,
  `orchestrator.deploys`); a worker of that definition takes the run over at its next claim and
  clears it. NULL: none.

Both nullable without a default: neither database rewrites the table to add them.

Revision ID: 0025_step_definitions
Revises: 0024_session_turns
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025_step_definitions"
down_revision = "0024_session_turns"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ratchet_messages", sa.Column("definition_hash", sa.String(64), nullable=True))
    op.add_column("ratchet_runs", sa.Column("accepted_definition", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ratchet_runs") as batch:
        batch.drop_column("accepted_definition")
    with op.batch_alter_table("ratchet_messages") as batch:
        batch.drop_column("definition_hash")
