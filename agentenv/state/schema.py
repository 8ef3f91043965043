"""The state store's tables, described once for every database it runs on (SQLite,
PostgreSQL); `migrations/` moves a store from any earlier schema to this one."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# Times are ISO 8601 text in UTC and JSON is text: the same bytes on every database, and
# what stores made before migrations existed already hold.
sandboxes = sa.Table(
    "sandboxes",
    metadata,
    sa.Column("sandbox_id", sa.Text, primary_key=True),
    # The node that runs it or holds its paused files; "" while no node does (its node was
    # lost and its files are in the object store).
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
    sa.Column("pause_after_idle", sa.Integer, nullable=False, server_default="0"),
    sa.Column("auto_resume", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("network", sa.Text, nullable=False, server_default="{}"),
    sa.Column("traffic_token", sa.Text),
    # Volumes mounted into it: [{"name", "volumeID", "path"}].
    sa.Column("volume_mounts", sa.Text, nullable=False, server_default="[]"),
    sa.Column("agent_unresponsive_at_pause", sa.Boolean, nullable=False, server_default=sa.false()),
    # A network slot is a node's: two nodes may both use slot 0.
    sa.UniqueConstraint("node", "slot", name="sandboxes_node_slot"),
)

# Nodes register here and heartbeat; the control plane places on those that are `active`.
nodes = sa.Table(
    "nodes",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    # Where the control plane reaches the node's API and data plane.
    sa.Column("url", sa.Text, nullable=False),
    # active | draining | lost
    sa.Column("state", sa.Text, nullable=False),
    # What the node last reported (NodeCapacity as JSON).
    sa.Column("capacity", sa.Text, nullable=False, server_default="{}"),
    # Seconds since the epoch, by the writer's clock (nodes of one cluster keep time).
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("registered_at", sa.Float, nullable=False),
)

# Named persistent volumes; their files live on the node that serves them (`volumes/`).
volumes = sa.Table(
    "volumes",
    metadata,
    sa.Column("volume_id", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    # The content API's bearer token for this volume.
    sa.Column("token", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    # Its NFS export's id (1 to 65535), kept for its life: guests' file handles carry it.
    sa.Column("export_id", sa.Integer, nullable=False, unique=True),
)

# Idempotency keys (`idempotency.py`): who runs a keyed operation, and then its answer.
idempotency_keys = sa.Table(
    "idempotency_keys",
    metadata,
    # Whose key: the answering role and a digest of the API key it came with.
    sa.Column("scope", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, primary_key=True),
    # A digest of the request (method, path, body): the key answers that request alone.
    sa.Column("request", sa.Text, nullable=False),
    # The run holding it, until when (seconds since the epoch): renewed while it runs.
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("lease_until", sa.Float, nullable=False),
    # Its answer, once it has one worth keeping.
    sa.Column("status", sa.Integer),
    sa.Column("body", sa.LargeBinary),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
)
