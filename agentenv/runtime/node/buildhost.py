"""Build sandboxes for template builds from steps, on this node (`images/stepbuild.py`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime

from ...errors import NotFound
from ...guest.client import AgentClient
from ...images.base import load_base_template
from ...images.buildcache import over_bound
from ...images.buildsteps import StepState
from ...images.catalog import BASE
from ...images.snapshots import BUILD_CACHE, TEMPLATE, SnapshotRecord
from ...images.stepbuild import CACHE_ENTRY_PREFIX, cache_entry_name
from ...state.sandboxes import SandboxOptions, SandboxRecord
from ..sandboxes.creation import CreateRequest
from ..snapshots.named import SandboxSnapshots

log = logging.getLogger(__name__)

# A build sandbox lives as long as its build; this only bounds a forgotten one.
BUILD_SANDBOX_TIMEOUT = 6 * 3600
# Metadata that marks a build sandbox in listings.
BUILD_LABEL = "aenv.build"


class NodeBuildHost:
    """The `BuildHost` of one node: sandboxes made, driven and snapshotted here."""

    def __init__(
        self,
        create: Callable[[CreateRequest], Awaitable[SandboxRecord]],
        snapshots: SandboxSnapshots,
    ) -> None:
        # The node's own create: a snapshot (a built parent, a cache entry) or a template.
        self._create = create
        self.snapshots = snapshots
        self.manager = snapshots.manager

    async def create(self, parent: str, vcpus: int | None, memory_mb: int | None) -> str:
        request = CreateRequest(
            template_id=parent,
            timeout=BUILD_SANDBOX_TIMEOUT,
            options=SandboxOptions(metadata={BUILD_LABEL: parent}),
            vcpus=vcpus,
            memory_mb=memory_mb,
        )
        return (await self._create(request)).sandbox_id

    async def _agent(self, sandbox_id: str) -> AgentClient:
        return self.manager.machines.agent(await self.manager.get(sandbox_id))

    async def identity(self, parent: str) -> str:
        """What the parent's content is: a snapshot build, an image digest, base's version."""
        snapshot = await asyncio.to_thread(self.snapshots.registry.lookup, parent)
        if snapshot is not None:
            return f"snapshot:{snapshot.snapshot_id}"
        if parent == BASE:
            base = load_base_template(self.manager.cfg)
            return f"base:{base.version if base else 'none'}"
        record = await asyncio.to_thread(self.snapshots.catalog.templates.get, parent)
        return f"image:{record.digest}"

    async def run(
        self,
        sandbox_id: str,
        argv: list[str],
        *,
        user: str | None,
        cwd: str | None,
        env: dict[str, str],
        output: Callable[[str], None] | None,
    ) -> int:
        agent = await self._agent(sandbox_id)
        return await agent.run(argv, user=user, cwd=cwd, env=env, output=output)

    async def start(
        self, sandbox_id: str, argv: list[str], *, user: str | None, cwd: str | None
    ) -> None:
        await (await self._agent(sandbox_id)).start_detached(argv, tag="start", user=user, cwd=cwd)

    async def write(self, sandbox_id: str, path: str, data: bytes) -> None:
        await (await self._agent(sandbox_id)).write_file(path, data)

    async def snapshot(self, sandbox_id: str, name: str, state: StepState, memory: bool) -> str:
        guest: dict[str, object] = {}
        source = await self.manager.get(sandbox_id)
        guest["env"] = {**source.guest.get("env", {}), **state.env}
        if state.user:
            guest["user"] = state.user
        if state.workdir:
            guest["workdir"] = state.workdir
        kind = TEMPLATE if memory else BUILD_CACHE
        taken = await self.snapshots.take(sandbox_id, name, memory, guest=guest, kind=kind)
        if kind == BUILD_CACHE:
            # A step run again (forced) replaces its entry: one build per key is enough.
            builds = await asyncio.to_thread(self.snapshots.registry.builds, name)
            for old in builds:
                if old.tag != taken.tag:
                    await self.snapshots.delete(old.snapshot_id)
            await self._bound_cache(taken.snapshot_id)
        return taken.snapshot_id

    async def _bound_cache(self, taken: str) -> None:
        """Delete the entries least recently built from while the cache is over its bound."""
        # The cache's records only: not every snapshot's, for each step a build caches.
        records = await asyncio.to_thread(self.snapshots.registry.list, CACHE_ENTRY_PREFIX)
        limit = self.manager.cfg.cache.build_max_bytes
        for entry in over_bound(records, limit, keep=taken):
            log.info("step cache over %d bytes: evicting %s", limit, entry.snapshot_id)
            try:
                await self.snapshots.delete(entry.snapshot_id)
            except NotFound:
                continue  # another build evicted it first

    async def cached(self, key: str) -> tuple[str, StepState] | None:
        found = await asyncio.to_thread(self.snapshots.registry.lookup, cache_entry_name(key))
        if found is None or found.kind != BUILD_CACHE:
            return None
        used = replace(found, used_at=datetime.now(UTC).isoformat())
        await asyncio.to_thread(self.snapshots.registry.save, used)
        return found.snapshot_id, _state_of(found)

    async def parent_state(self, parent: str) -> StepState | None:
        found = await asyncio.to_thread(self.snapshots.registry.lookup, parent)
        return _state_of(found) if found is not None and found.kind == TEMPLATE else None

    async def kill(self, sandbox_id: str) -> None:
        await self.manager.kill(sandbox_id)

    async def tag(self, snapshot_id: str, tags: list[str]) -> None:
        registry = self.snapshots.registry
        build = await asyncio.to_thread(registry.get, snapshot_id)
        await asyncio.to_thread(registry.tag, build, tags)

    async def retire(self, name: str) -> None:
        builds = await asyncio.to_thread(self.snapshots.registry.builds, name)
        if builds and builds[-1].kind == TEMPLATE:
            await self.snapshots.delete(name)


def _state_of(snapshot: SnapshotRecord) -> StepState:
    """The ENV, USER and WORKDIR a snapshot's sandboxes are given."""
    guest = snapshot.guest
    return StepState(
        env=dict(guest.get("env", {})),
        user=guest.get("user") or None,
        workdir=guest.get("workdir") or None,
    )
