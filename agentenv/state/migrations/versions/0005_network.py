"""A sandbox's network option: its egress rules, public traffic and host mask.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("network", sa.Text, nullable=False, server_default="{}"))
        batch.add_column(sa.Column("traffic_token", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("traffic_token")
        batch.drop_column("network")
