"""The prompt-cache writes of a reply (issue 26): `ratchet_messages.cache_write_tokens`.

Anthropic reports the input tokens it wrote to its prompt cache (`cache_creation_input_tokens`)
apart from those it read; they are within `input_tokens`, as the reads are, and cost at their own
rate (`Prices.cache_write`). A nullable column with no default: neither database rewrites the
table to add it. Older rows, and replies of providers that do not report it, keep NULL (unknown).

Revision ID: 0019_cache_write_tokens
Revises: 0018_rates_latencies
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_cache_write_tokens"
down_revision = "0018_rates_latencies"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("ratchet_messages", sa.Column("cache_write_tokens", sa.Integer, nullable=True))


def downgrade() -> None:
    # Its totals (a token kind nothing before counts) go with it.
    totals = sa.table("ratchet_metric_totals", sa.column("name", sa.String), sa.column("label", sa.String))
    op.execute(totals.delete().where(totals.c.name == "tokens", totals.c.label == "cache_write"))
    with op.batch_alter_table("ratchet_messages") as batch:
        batch.drop_column("cache_write_tokens")
