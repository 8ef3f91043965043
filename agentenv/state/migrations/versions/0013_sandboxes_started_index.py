"""Sandboxes in listing order, so a page of a large store is read by its cursor alone.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sandboxes_started", "sandboxes", ["started_at", "sandbox_id"])


def downgrade() -> None:
    op.drop_index("ix_sandboxes_started", "sandboxes")
