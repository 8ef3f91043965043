"""Sandboxes a lost node took with it: what became of them, for users and operators.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lost_sandboxes",
        sa.Column("sandbox_id", sa.Text, primary_key=True),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("template_id", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("lost_at", sa.Float, nullable=False),
    )
    op.create_index("ix_lost_sandboxes_lost_at", "lost_sandboxes", ["lost_at"])


def downgrade() -> None:
    op.drop_index("ix_lost_sandboxes_lost_at", "lost_sandboxes")
    op.drop_table("lost_sandboxes")
