"""A session is one user's: the owner of sessions written before that rule, where it is known.

A session takes runs only for its first run's user (`ratchet_sessions.user_id`, no user being a
user too). A session whose row has no user but whose runs name exactly one user (it was made by
a run without one, for example before migration 0006 added users, and then one user's runs
joined it) becomes that user's: otherwise the rule would lock that user out of their own
conversation. A session with runs of two or more users keeps no owner, so no run with a user
joins it again; its runs stay readable (`get_session`), and each run's history and state are
still only its own user's.

Revision ID: 0011_session_owner
Revises: 0010_metrics
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0011_session_owner"
down_revision = "0010_metrics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # COUNT(DISTINCT ...) leaves NULLs out: = 1 means exactly one user among the session's runs.
    # Each subquery reads ix_ratchet_runs_session.
    op.execute(
        """
        UPDATE ratchet_sessions SET user_id = (
            SELECT MIN(r.user_id) FROM ratchet_runs r WHERE r.session_id = ratchet_sessions.session_id
        )
        WHERE user_id IS NULL AND (
            SELECT COUNT(DISTINCT r.user_id) FROM ratchet_runs r WHERE r.session_id = ratchet_sessions.session_id
        ) = 1
        """
    )


def downgrade() -> None:
    # The owners set here cannot be told from those set by a first run: they stay.
    pass
