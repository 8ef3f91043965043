"""The placement ledger: what the control plane placed on each node that the node's
heartbeats do not show yet. Kept in the state store, so every control-plane replica
counts every other's placements.

A placement is in flight until its node answers (then it is settled), and counts until a
heartbeat taken after that answer arrives (the node's own report holds it from then);
one whose node failed or refused is released at once.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from .schema import nodes, placements

# A heartbeat reflects a placement settled this many seconds before it: the node takes its
# report a moment before writing it, and clocks of one cluster differ a little.
SETTLE_MARGIN = 0.5
# A placement nobody settled or released (its control plane died) stops counting then.
ABANDONED_AFTER = 120.0


@dataclass(frozen=True)
class Placement:
    """One placement its node's heartbeats do not show yet."""

    placement_id: str
    node: str
    memory_mb: int
    vcpus: int


class PlacementLedger:
    """The `placements` table of a state store."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def reserve(
        self, node: str, memory_mb: int, vcpus: int, placement_id: str | None = None
    ) -> str:
        """Count a placement on `node` from now; its id (`placement_id`, else a new one)."""
        placement_id = placement_id or uuid.uuid4().hex
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.insert(placements).values(
                    placement_id=placement_id,
                    node=node,
                    memory_mb=memory_mb,
                    vcpus=vcpus,
                    created_at=time.time(),
                )
            )
        return placement_id

    async def settle(self, placement_id: str) -> None:
        """Its node took it: it counts until the node's next heartbeat."""
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.update(placements)
                .where(placements.c.placement_id == placement_id)
                .values(settled_at=time.time())
            )

    async def release(self, placement_id: str) -> None:
        """Its node failed or refused it: it never counted there."""
        async with self.engine.begin() as connection:
            await connection.execute(
                sa.delete(placements).where(placements.c.placement_id == placement_id)
            )

    async def outstanding(self) -> list[Placement]:
        """The placements their node's last heartbeat does not reflect."""
        query = (
            sa.select(
                placements.c.placement_id,
                placements.c.node,
                placements.c.memory_mb,
                placements.c.vcpus,
            )
            .join(nodes, nodes.c.name == placements.c.node)
            .where(_counting(time.time()))
        )
        async with self.engine.connect() as connection:
            return [Placement(*row) for row in await connection.execute(query)]

    async def forget_reflected(self) -> int:
        """Delete the placements that count no more; how many."""
        heartbeat = sa.select(nodes.c.heartbeat_at).where(nodes.c.name == placements.c.node)
        async with self.engine.begin() as connection:
            deleted = await connection.execute(
                sa.delete(placements).where(
                    sa.not_(_counting(time.time(), heartbeat.scalar_subquery()))
                )
            )
        return deleted.rowcount


def _counting(
    now: float, heartbeat_at: sa.ColumnElement[float] | None = None
) -> sa.ColumnElement[bool]:
    """Whether a placement still counts: not abandoned, and in flight or settled after
    its node's last heartbeat (less the margin)."""
    beat = nodes.c.heartbeat_at if heartbeat_at is None else heartbeat_at
    return sa.and_(
        placements.c.created_at > now - ABANDONED_AFTER,
        sa.or_(
            placements.c.settled_at.is_(None),
            placements.c.settled_at + SETTLE_MARGIN > beat,
        ),
    )
