"""Hosted credentials and workload identity: secrets, signing keys, a sandbox's tokens.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "secrets",
        sa.Column("secret_id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.Column("key_id", sa.Text, nullable=False),
        sa.Column("sealed", sa.LargeBinary, nullable=False),
    )
    op.create_table(
        "signing_keys",
        sa.Column("kid", sa.Text, primary_key=True),
        sa.Column("generation", sa.Integer, nullable=False, unique=True),
        sa.Column("algorithm", sa.Text, nullable=False),
        sa.Column("public_jwk", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("active_at", sa.Float, nullable=False),
        sa.Column("key_id", sa.Text, nullable=False),
        sa.Column("sealed", sa.LargeBinary, nullable=False),
    )
    with op.batch_alter_table("sandboxes") as batch:
        batch.add_column(sa.Column("iam", sa.Text, nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("sandboxes") as batch:
        batch.drop_column("iam")
    op.drop_table("signing_keys")
    op.drop_table("secrets")
