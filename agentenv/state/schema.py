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
    # Its workload identity tokens as created: {"tokens": {name: {audience, tokenType}}}.
    sa.Column("iam", sa.Text, nullable=False, server_default="{}"),
    sa.Column("agent_unresponsive_at_pause", sa.Boolean, nullable=False, server_default=sa.false()),
    # A network slot is a node's: two nodes may both use slot 0.
    sa.UniqueConstraint("node", "slot", name="sandboxes_node_slot"),
    # Listings page through every node's sandboxes in this order (`page`).
    sa.Index("ix_sandboxes_started", "started_at", "sandbox_id"),
)

# Sandboxes a lost node took with it (`lost.py`): their row in `sandboxes` is gone, this
# says what became of them, for their users (a 404 naming the loss) and operators.
lost_sandboxes = sa.Table(
    "lost_sandboxes",
    metadata,
    sa.Column("sandbox_id", sa.Text, primary_key=True),
    sa.Column("node", sa.Text, nullable=False),
    sa.Column("template_id", sa.Text, nullable=False),
    # The state it was in, and why that could not outlive the node.
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("metadata", sa.Text, nullable=False),
    # Seconds since the epoch, by the control plane's clock.
    sa.Column("lost_at", sa.Float, nullable=False, index=True),
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

# What the control plane placed on a node that its heartbeats do not show yet
# (`placements.py`): in flight until settled, then counted until a newer heartbeat.
placements = sa.Table(
    "placements",
    metadata,
    sa.Column("placement_id", sa.Text, primary_key=True),
    sa.Column("node", sa.Text, nullable=False, index=True),
    sa.Column("memory_mb", sa.Integer, nullable=False),
    sa.Column("vcpus", sa.Integer, nullable=False),
    # Seconds since the epoch, by the control plane's clock.
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("settled_at", sa.Float),
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

# Hosted credentials (`credentials/vault.py`). Only the current version's value is kept,
# sealed with the server key named by `key_id` (kept beside it so that key can rotate).
# Times are ISO 8601 text in UTC with microseconds, so they sort as text.
secrets = sa.Table(
    "secrets",
    metadata,
    sa.Column("secret_id", sa.Text, primary_key=True),
    # Lower case; never starts with "sec_", the ids' prefix.
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("metadata", sa.Text, nullable=False),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.Column("key_id", sa.Text, nullable=False),
    sa.Column("sealed", sa.LargeBinary, nullable=False),
)

# The keys workload identity tokens are signed with (`credentials/identity.py`): each is
# published from its creation, signs from `active_at` until the next generation's, and
# is published until the last token it signed has expired.
signing_keys = sa.Table(
    "signing_keys",
    metadata,
    sa.Column("kid", sa.Text, primary_key=True),
    # 1, 2, ...: unique, so two nodes rotating at once make one new key.
    sa.Column("generation", sa.Integer, nullable=False, unique=True),
    sa.Column("algorithm", sa.Text, nullable=False),
    # The public key as a JWK (JSON): the control plane serves it without the server key.
    sa.Column("public_jwk", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("active_at", sa.Float, nullable=False),
    # The private key (PKCS#8 DER) sealed with the server key `key_id`.
    sa.Column("key_id", sa.Text, nullable=False),
    sa.Column("sealed", sa.LargeBinary, nullable=False),
)
