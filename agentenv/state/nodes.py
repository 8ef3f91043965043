"""Nodes in the state store: each registers, heartbeats what it holds, and is declared
lost when it falls silent; the control plane places on the active ones."""

from __future__ import annotations

import builtins
import functools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..errors import Conflict
from .schema import nodes


class NodeState(StrEnum):
    ACTIVE = "active"
    # No new placements; its paused sandboxes move on their next resume.
    DRAINING = "draining"
    # Silent past the timeout (or removed by hand while down): its sandboxes are not its own.
    LOST = "lost"

    # The questions the control plane and the nodes ask of a node's state.
    @property
    def places(self) -> bool:
        """New sandboxes (and what is not a sandbox's: builds, templates) go to it."""
        return self in PLACES

    @property
    def keeps_movable(self) -> bool:
        """Its sandboxes at rest in the object store stay its own: no other node adopts them."""
        return self in KEEPS_MOVABLE

    @property
    def holds_sandboxes(self) -> bool:
        """It still runs or holds its sandboxes (what cannot move finishes there); its
        heartbeats count and its layers are in use."""
        return self in HOLDS_SANDBOXES


class NodeEvent(StrEnum):
    # A node starting: active again, whatever it was.
    REGISTER = "register"
    DRAIN = "drain"
    # A drain undone.
    ACTIVATE = "activate"
    # Silent past the timeout, or removed by hand.
    LOSE = "lose"


# (state, event) -> next state. Anything absent is refused with `NodeTransitionError`.
NODE_TRANSITIONS: dict[tuple[NodeState, NodeEvent], NodeState] = {
    **{(state, NodeEvent.REGISTER): NodeState.ACTIVE for state in NodeState},
    (NodeState.ACTIVE, NodeEvent.DRAIN): NodeState.DRAINING,
    (NodeState.DRAINING, NodeEvent.DRAIN): NodeState.DRAINING,
    (NodeState.ACTIVE, NodeEvent.ACTIVATE): NodeState.ACTIVE,
    (NodeState.DRAINING, NodeEvent.ACTIVATE): NodeState.ACTIVE,
    **{(state, NodeEvent.LOSE): NodeState.LOST for state in NodeState},
}

PLACES = frozenset({NodeState.ACTIVE})
KEEPS_MOVABLE = frozenset({NodeState.ACTIVE})
HOLDS_SANDBOXES = frozenset({NodeState.ACTIVE, NodeState.DRAINING})


class NodeTransitionError(Conflict):
    """An event the node's current state does not allow (HTTP 409)."""

    def __init__(self, name: str, state: NodeState, event: NodeEvent) -> None:
        rejoin = ": it rejoins when it starts again" if state is NodeState.LOST else ""
        super().__init__(f"node '{name}' is {state.value}, it cannot {event.value}{rejoin}")


def next_node_state(name: str, state: NodeState, event: NodeEvent) -> NodeState:
    try:
        return NODE_TRANSITIONS[(state, event)]
    except KeyError:
        raise NodeTransitionError(name, state, event) from None


@dataclass
class NodeCapacity:
    """What a node reports with each heartbeat."""

    memory_mb: int = 0
    committed_memory_mb: int = 0
    disk_mb: int = 0
    committed_disk_mb: int = 0
    max_vcpus: int = 0
    # The host's cores, the vCPUs its running sandboxes were given, and its CPU's
    # 1-minute load average per core (1.0: every core busy).
    cores: int = 0
    committed_vcpus: int = 0
    cpu_load: float = 0.0
    running: int = 0
    paused: int = 0
    # Top layers of the stacks its block daemon serves (templates' disks, restored RAM).
    layers: list[str] = field(default_factory=list)
    # Snapshots (`name:tag`) whose files it holds.
    snapshots: list[str] = field(default_factory=list)
    # Its chunk cache: bytes held, and the bound eviction keeps them under.
    cache_bytes: int = 0
    cache_limit_bytes: int = 0
    # A hollow node (tests, benchmarks): its sandboxes have no guest.
    hollow: bool = False

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
    state: NodeState
    capacity: NodeCapacity
    # When the node took the capacity it last reported (placements settled before then
    # are in it), not when the report was written: on a loaded node the two lie seconds
    # apart.
    heartbeat_at: float
    registered_at: float

    def silent_for(self, now: float | None = None) -> float:
        return (time.time() if now is None else now) - self.heartbeat_at


def _info(row: sa.Row[Any]) -> NodeInfo:
    values = dict(row._mapping)
    known = set(NodeCapacity.__dataclass_fields__)
    reported = {k: v for k, v in json.loads(values.pop("capacity")).items() if k in known}
    state = NodeState(values.pop("state"))
    return NodeInfo(capacity=NodeCapacity(**reported), state=state, **values)


# Run in a node-loss transaction with the names of the nodes holding no sandboxes.
SettleLost = Callable[[AsyncConnection, builtins.list[str]], Awaitable[None]]


class NodeRegistry:
    """The `nodes` table of a state store."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def register(
        self, name: str, url: str, capacity: NodeCapacity, taken_at: float | None = None
    ) -> None:
        """A node starting: active again (whatever it was), reachable at `url`, with
        `capacity` as it stood at `taken_at` (now by default)."""
        now = time.time()
        beat = now if taken_at is None else taken_at
        values = {"url": url, "capacity": json.dumps(asdict(capacity)), "heartbeat_at": beat}
        async with self.engine.begin() as connection:
            current = await connection.scalar(sa.select(nodes.c.state).where(nodes.c.name == name))
            if current is None:
                await connection.execute(
                    sa.insert(nodes).values(
                        name=name, state=NodeState.ACTIVE, registered_at=now, **values
                    )
                )
                return
            state = next_node_state(name, NodeState(current), NodeEvent.REGISTER)
            await connection.execute(
                sa.update(nodes).where(nodes.c.name == name).values(state=state, **values)
            )

    async def heartbeat(
        self, name: str, capacity: NodeCapacity, taken_at: float | None = None
    ) -> NodeState | None:
        """Report `capacity` as it stood at `taken_at` (now by default); the node's state
        now (None: it was removed). A lost node is not revived by its heartbeat."""
        beat = time.time() if taken_at is None else taken_at
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.update(nodes)
                .where(nodes.c.name == name, nodes.c.state.in_(HOLDS_SANDBOXES))
                .values(capacity=json.dumps(asdict(capacity)), heartbeat_at=beat)
            )
            state = await connection.scalar(sa.select(nodes.c.state).where(nodes.c.name == name))
        return None if state is None else NodeState(state)

    async def list(self) -> list[NodeInfo]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(sa.select(nodes).order_by(nodes.c.name))
            return [_info(row) for row in rows]

    async def get(self, name: str) -> NodeInfo | None:
        async with self.engine.connect() as connection:
            rows = list(await connection.execute(sa.select(nodes).where(nodes.c.name == name)))
        return _info(rows[0]) if rows else None

    async def fire(self, name: str, event: NodeEvent) -> NodeState | None:
        """Move a node by `event` as the table allows (409 if it does not); its new state,
        None when there is no such node. The write is a compare-and-set on the state read."""
        async with self.engine.begin() as connection:
            current = await connection.scalar(sa.select(nodes.c.state).where(nodes.c.name == name))
            if current is None:
                return None
            state = next_node_state(name, NodeState(current), event)
            changed = await connection.execute(
                sa.update(nodes)
                .where(nodes.c.name == name, nodes.c.state == current)
                .values(state=state)
            )
        if changed.rowcount == 0:
            raise Conflict(f"node '{name}' changed meanwhile; try again")
        return state

    async def remove(self, name: str) -> bool:
        async with self.engine.begin() as connection:
            changed = await connection.execute(sa.delete(nodes).where(nodes.c.name == name))
        return changed.rowcount > 0

    async def declare_lost(
        self, timeout: float, settle: SettleLost | None = None
    ) -> builtins.list[str]:
        """Mark every node silent for longer than `timeout` lost; their names. `settle`
        gets the names of every node that holds no sandboxes now, in the same transaction:
        what they held leaves with them, never seen after them."""
        deadline = time.time() - timeout
        # Every state allows LOSE; a node already lost has nothing more to lose.
        silent = sa.and_(nodes.c.state.in_(HOLDS_SANDBOXES), nodes.c.heartbeat_at < deadline)
        async with self.engine.begin() as connection:
            names = list(await connection.scalars(sa.select(nodes.c.name).where(silent)))
            if names:
                await connection.execute(
                    sa.update(nodes)
                    .where(silent, nodes.c.name.in_(names))
                    .values(state=NodeState.LOST)
                )
            if settle is not None:
                holding_none = sa.select(nodes.c.name).where(nodes.c.state.not_in(HOLDS_SANDBOXES))
                released = list(await connection.scalars(holding_none))
                if released:
                    await settle(connection, released)
        return names
