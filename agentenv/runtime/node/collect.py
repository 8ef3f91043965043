"""Garbage collection of the object store as a node runs it: every layer a template, a
snapshot, a sandbox record or a node's block daemon still uses is a root; the rest goes
once older than the grace period (`storage/gc.py` has the protocol)."""

from __future__ import annotations

import asyncio
import logging

from ...config import StorageConfig
from ...images.snapshots import SnapshotRegistry
from ...images.templates import TemplateRegistry
from ...state.nodes import NodeRegistry
from ...state.sandboxes import SandboxStore
from ...storage.blockd import BlockdClient
from ...storage.gc import CollectReport, collect
from ...storage.objectstore import ObjectStore

log = logging.getLogger(__name__)

# Seconds the periodic collection waits for writers' leases to go before it skips a turn.
LEASE_WAIT = 60.0


class Collector:
    """`run`: one collection over the node's object store."""

    def __init__(
        self,
        objects: ObjectStore,
        templates: TemplateRegistry,
        snapshots: SnapshotRegistry,
        sandboxes: SandboxStore,
        blockd: BlockdClient,
        nodes: NodeRegistry,
    ) -> None:
        self.objects = objects
        self.templates = templates
        self.snapshots = snapshots
        self.sandboxes = sandboxes
        self.blockd = blockd
        self.nodes = nodes
        self._lock = asyncio.Lock()

    def roots(self, loop: asyncio.AbstractEventLoop) -> set[str]:
        """Blocking (called by the collector's thread): every layer still in use."""
        roots: set[str] = set()
        # Every node's sandboxes: they share the object store.
        sandboxes = asyncio.run_coroutine_threadsafe(self.sandboxes.list_all(), loop).result()
        for sandbox in sandboxes:
            roots.update(sandbox.layers.values())
        for template in self.templates.list():
            roots.update(template.layers)
        for snapshot in self.snapshots.list():
            roots.update(snapshot.stored.values())
            roots.update(snapshot.base.values())
        # Stacks served to sandboxes whose template was deleted meanwhile: this node's
        # block daemon's, and the top layers every other node reported in its heartbeat.
        for mount in self.blockd.status().get("mounts", []):
            roots.update(mount.get("layers", []))
        nodes = asyncio.run_coroutine_threadsafe(self.nodes.list(), loop).result()
        for node in nodes:
            if node.state.holds_sandboxes:
                roots.update(node.capacity.layers)
        return roots

    async def run_every(self, cfg: StorageConfig) -> None:
        """Collect every `gc_interval` seconds (never when it is 0) until cancelled."""
        if cfg.gc_interval <= 0:
            return
        while True:
            await asyncio.sleep(cfg.gc_interval)
            try:
                await self.run(cfg.gc_grace)
            except Exception:
                log.exception("object store collection failed")

    async def run(self, grace: float, wait: float = LEASE_WAIT) -> CollectReport:
        """One collection; skipped (said in the report) if writers still hold leases
        after `wait` seconds."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            report = await asyncio.to_thread(
                collect, self.objects, lambda: self.roots(loop), grace, wait
            )
        log.info("object store collected: %s", report)
        return report
