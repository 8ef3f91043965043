"""Nodes of a cluster: where each is reached, what it holds and when it last spoke.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("capacity", sa.Text, nullable=False, server_default="{}"),
        sa.Column("heartbeat_at", sa.Float, nullable=False),
        sa.Column("registered_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("nodes")
