"""Idempotency keys: keyed operations and their answers, for 24 hours.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("scope", sa.Text, primary_key=True),
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("owner", sa.Text, nullable=False),
        sa.Column("lease_until", sa.Float, nullable=False),
        sa.Column("status", sa.Integer),
        sa.Column("body", sa.LargeBinary),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_idempotency_keys_created_at", "idempotency_keys", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_idempotency_keys_created_at", "idempotency_keys")
    op.drop_table("idempotency_keys")
