"""Sandboxes with their node; a store made before migrations is carried over.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_LEGACY = "sandboxes_before_migrations"


def _create() -> None:
    op.create_table(
        "sandboxes",
        sa.Column("sandbox_id", sa.Text, primary_key=True),
        sa.Column("node", sa.Text, nullable=False, server_default=""),
        sa.Column("template_id", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("started_at", sa.Text, nullable=False),
        sa.Column("end_at", sa.Text, nullable=False),
        sa.Column("vcpus", sa.Integer, nullable=False),
        sa.Column("memory_mb", sa.Integer, nullable=False),
        sa.Column("disk_mb", sa.Integer, nullable=False),
        sa.Column("slot", sa.Integer, nullable=False),
        sa.Column("metadata", sa.Text, nullable=False),
        sa.Column("env_vars", sa.Text, nullable=False),
        sa.Column("auto_pause", sa.Boolean, nullable=False),
        sa.Column("allow_internet", sa.Boolean, nullable=False),
        sa.Column("access_token", sa.Text),
        sa.Column("alias", sa.Text),
        sa.Column("vm", sa.Text),
        sa.Column("guest", sa.Text, nullable=False, server_default="{}"),
        sa.Column("auto_pause_memory", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("pause_mode", sa.Text),
        sa.Column("layers", sa.Text, nullable=False, server_default="{}"),
        sa.Column("stored", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.UniqueConstraint("node", "slot", name="sandboxes_node_slot"),
    )


def upgrade() -> None:
    legacy = sa.inspect(op.get_bind()).has_table("sandboxes")
    if legacy:
        # A single node's SQLite store from before migrations: its slots were unique on
        # their own, and it lacked the columns added since (their defaults apply).
        op.rename_table("sandboxes", _LEGACY)
    _create()
    if legacy:
        kept = [c["name"] for c in sa.inspect(op.get_bind()).get_columns(_LEGACY)]
        names = ", ".join(kept)
        op.execute(f"INSERT INTO sandboxes ({names}) SELECT {names} FROM {_LEGACY}")
        op.drop_table(_LEGACY)


def downgrade() -> None:
    op.drop_table("sandboxes")
