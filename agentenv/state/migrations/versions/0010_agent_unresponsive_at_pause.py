"""Whether a paused sandbox's guest agent answered when its memory was saved.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(
            sa.Column(
                "agent_unresponsive_at_pause", sa.Boolean, nullable=False, server_default=sa.false()
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("agent_unresponsive_at_pause")
