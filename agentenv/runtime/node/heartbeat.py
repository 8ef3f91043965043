"""A node in a cluster: registered in the state store at start, then a heartbeat with
what it holds every few seconds. A node the control plane declared lost stops itself:
its sandboxes may already run elsewhere, and a restart reclaims what it still holds."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable

from ...state.lifecycle import PUBLIC_STATE
from ...state.nodes import NodeCapacity, NodeRegistry
from ...storage.blockd import BlockdClient
from ..memory.admission import committed_by
from ..sandboxes.manager import SandboxManager
from ..snapshots.named import SandboxSnapshots
from .handoff import release_moved

log = logging.getLogger(__name__)


async def node_capacity(
    manager: SandboxManager,
    snapshots: SandboxSnapshots,
    blockd: BlockdClient,
    *,
    hollow: bool = False,
) -> NodeCapacity:
    """What a node holds and may take now, as its heartbeat reports it."""
    records = await manager.store.footprints()
    committed = committed_by(records)
    mounts = await asyncio.to_thread(blockd.status)
    stats = await asyncio.to_thread(blockd.try_stats)
    cache = (stats or {}).get("cache") or {}
    cores = os.cpu_count() or 1
    return NodeCapacity(
        memory_mb=manager.intake.capacity.memory_mb,
        committed_memory_mb=sum(d.memory_mb for d in committed),
        disk_mb=manager.intake.capacity.disk_mb,
        committed_disk_mb=sum(d.disk_mb for d in committed),
        max_vcpus=manager.intake.capacity.max_vcpus,
        cores=cores,
        committed_vcpus=sum(d.vcpus for d in committed),
        cpu_load=round(os.getloadavg()[0] / cores, 3),
        running=sum(PUBLIC_STATE[r.state] == "running" for r in records),
        paused=sum(PUBLIC_STATE[r.state] == "paused" for r in records),
        layers=[m["layers"][-1] for m in mounts.get("mounts", []) if m.get("layers")],
        snapshots=await asyncio.to_thread(snapshots.local_ids),
        cache_bytes=int(cache.get("bytes_used", 0)),
        cache_limit_bytes=manager.cfg.cache.max_bytes,
        hollow=hollow,
    )


class NodePresence:
    """This node's row in the `nodes` table."""

    def __init__(
        self,
        registry: NodeRegistry,
        manager: SandboxManager,
        snapshots: SandboxSnapshots,
        blockd: BlockdClient,
        stop: Callable[[], None] | None = None,
        *,
        hollow: bool = False,
    ) -> None:
        self.registry = registry
        self.hollow = hollow
        self.manager = manager
        self.snapshots = snapshots
        self.blockd = blockd
        self.name = manager.cfg.node_name
        self._stop = stop or (lambda: os.kill(os.getpid(), signal.SIGTERM))

    async def capacity(self) -> NodeCapacity:
        return await node_capacity(self.manager, self.snapshots, self.blockd, hollow=self.hollow)

    async def _taken_capacity(self) -> tuple[NodeCapacity, float]:
        """The capacity, and the time before it was read (what it reflects for sure)."""
        taken_at = time.time()
        return await self.capacity(), taken_at

    async def register(self) -> None:
        url = self.manager.cfg.advertise_url
        await self.registry.register(self.name, url, *await self._taken_capacity())
        log.info("node %s registered at %s", self.name, url)

    async def run(self, interval: float) -> None:
        """Heartbeat every `interval` seconds until cancelled, or until declared lost."""
        while True:
            await asyncio.sleep(interval)
            try:
                state = await self.registry.heartbeat(self.name, *await self._taken_capacity())
                await release_moved(self.manager)
            except Exception:
                log.exception("heartbeat of node %s failed", self.name)
                continue
            if state is None or not state.holds_sandboxes:
                log.error("node %s was declared lost or removed: stopping", self.name)
                self._stop()
                return
