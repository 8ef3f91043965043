"""Volumes mounted into sandboxes: each sandbox's mounts, each volume's NFS export id.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("volume_mounts", sa.Text, nullable=False, server_default="[]"))
    with op.batch_alter_table("volumes") as batch:
        batch.add_column(sa.Column("export_id", sa.Integer))
    volumes = sa.table("volumes", sa.column("volume_id", sa.Text), sa.column("export_id"))
    connection = op.get_bind()
    ids = [row[0] for row in connection.execute(sa.select(volumes.c.volume_id))]
    for number, volume_id in enumerate(sorted(ids), start=1):
        connection.execute(
            sa.update(volumes).where(volumes.c.volume_id == volume_id).values(export_id=number)
        )
    with op.batch_alter_table("volumes") as batch:
        batch.alter_column("export_id", existing_type=sa.Integer, nullable=False)
        batch.create_unique_constraint("uq_volumes_export_id", ["export_id"])


def downgrade() -> None:
    with op.batch_alter_table("volumes") as batch:
        batch.drop_constraint("uq_volumes_export_id", type_="unique")
        batch.drop_column("export_id")
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("volume_mounts")
