"""Nodes in the state store: each registers, heartbeats what it holds, and is declared
lost when it falls silent; the control plane places on the active ones."""

from __future__ import annotations

import builtins
import functools
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from .schema import nodes

ACTIVE = "active"
# No new placements; its paused sandboxes move on their next resume.
DRAINING = "draining"
# Silent past the timeout (or removed by hand while down): its sandboxes are not its own.
LOST = "lost"
NODE_STATES = (ACTIVE, DRAINING, LOST)


@dataclass
class NodeCapacity:
    """What a node reports with each heartbeat."""

    memory_mb: int = 0
    committed_memory_mb: int = 0
    disk_mb: int = 0
    committed_disk_mb: int = 0
    max_vcpus: int = 0
    running: int = 0
    paused: int = 0
    # Top layers of the stacks its block daemon serves (templates' disks, restored RAM).
    layers: list[str] = field(default_factory=list)
    # Snapshots (`name:tag`) whose files it holds.
    snapshots: list[str] = field(default_factory=list)

    @property
    def free_memory_mb(self) -> int:
        return self.memory_mb - self.committed_memory_mb

    @functools.cached_property
    def layer_set(self) -> set[str]:
        """`layers` for membership tests (placement asks once per node per create)."""
        return set(self.layers)

    @functools.cached_property
    def snapshot_set(self) -> set[str]:
        return set(self.snapshots)


@dataclass
class NodeInfo:
    name: str
    url: str
    state: str
    capacity: NodeCapacity
    heartbeat_at: float
    registered_at: float

    def silent_for(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.heartbeat_at


def _info(row: sa.Row[Any]) -> NodeInfo:
    values = dict(row._mapping)
    known = set(NodeCapacity.__dataclass_fields__)
    reported = {k: v for k, v in json.loads(values.pop("capacity")).items() if k in known}
    return NodeInfo(capacity=NodeCapacity(**reported), **values)


class NodeRegistry:
    """The `nodes` table of a state store."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def register(self, name: str, url: str, capacity: NodeCapacity) -> None:
        """A node starting: active again (whatever it was), reachable at `url`."""
        now = time.time()
        values = {"url": url, "capacity": json.dumps(asdict(capacity)), "heartbeat_at": now}
        async with self.engine.begin() as connection:
            changed = await connection.execute(
                sa.update(nodes).where(nodes.c.name == name).values(state=ACTIVE, **values)
            )
            if changed.rowcount == 0:
                await connection.execute(
                    sa.insert(nodes).values(name=name, state=ACTIVE, registered_at=now, **values)
                )

    async def heartbeat(self, name: str, capacity: NodeCapacity) -> str | None:
        """Report `capacity`; the node's state now (None: it was removed). A lost node is
        not revived by its heartbeat: it has to start again (`register`)."""
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.update(nodes)
                .where(nodes.c.name == name, nodes.c.state != LOST)
                .values(capacity=json.dumps(asdict(capacity)), heartbeat_at=time.time())
            )
            state = await connection.scalar(sa.select(nodes.c.state).where(nodes.c.name == name))
        return state

    async def list(self) -> list[NodeInfo]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(sa.select(nodes).order_by(nodes.c.name))
            return [_info(row) for row in rows]

    async def get(self, name: str) -> NodeInfo | None:
        async with self.engine.connect() as connection:
            rows = list(await connection.execute(sa.select(nodes).where(nodes.c.name == name)))
        return _info(rows[0]) if rows else None

    async def set_state(self, name: str, state: str) -> bool:
        """Set a node's state; False when there is no such node."""
        if state not in NODE_STATES:
            raise ValueError(f"unknown node state {state!r}")
        async with self.engine.begin() as connection:
            changed = await connection.execute(
                sa.update(nodes).where(nodes.c.name == name).values(state=state)
            )
        return changed.rowcount > 0

    async def remove(self, name: str) -> bool:
        async with self.engine.begin() as connection:
            changed = await connection.execute(sa.delete(nodes).where(nodes.c.name == name))
        return changed.rowcount > 0

    async def declare_lost(self, timeout: float) -> builtins.list[str]:
        """Mark every node silent for longer than `timeout` lost; their names."""
        deadline = time.time() - timeout
        silent = sa.and_(nodes.c.state != LOST, nodes.c.heartbeat_at < deadline)
        async with self.engine.begin() as connection:
            names = list(await connection.scalars(sa.select(nodes.c.name).where(silent)))
            if names:
                await connection.execute(
                    sa.update(nodes).where(silent, nodes.c.name.in_(names)).values(state=LOST)
                )
        return names
