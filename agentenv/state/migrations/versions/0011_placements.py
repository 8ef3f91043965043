"""The placement ledger: placements on nodes that their heartbeats do not show yet.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "placements",
        sa.Column("placement_id", sa.Text, primary_key=True),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("vcpus", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("settled_at", sa.Float),
    )
    op.create_index("ix_placements_node", "placements", ["node"])


def downgrade() -> None:
    op.drop_index("ix_placements_node", "placements")
    op.drop_table("placements")
