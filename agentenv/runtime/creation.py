"""Creating a sandbox from a template: from a warm VM of the warm pool when one matches,
else provisioned from nothing (disk, network, a VM restored from the boot snapshot or
booted)."""

from __future__ import annotations

import asyncio

from ..control.store import SandboxRecord
from ..crashpoints import crash_point
from ..images.catalog import Template
from .bootsnap import Shape
from .cleanup import CleanupStack
from .manager import CreateRequest, SandboxManager, guest_config
from .warmpool import WarmPool, WarmVm


class SandboxCreations:
    """`create` for the sandboxes of one manager."""

    def __init__(self, manager: SandboxManager, pool: WarmPool | None = None) -> None:
        self.manager = manager
        self.pool = pool

    async def create(self, request: CreateRequest) -> SandboxRecord:
        """Start a sandbox; on any failure every acquired resource is released again."""
        manager = self.manager
        template = await asyncio.to_thread(manager.catalog.resolve, request.template_id)
        sandbox = manager.cfg.sandbox
        shape = Shape(template.vcpus or sandbox.vcpus, template.memory_mb or sandbox.memory_mb)
        pool = self.pool
        warm = pool.take(template.template_id, shape) if pool is not None else None
        try:
            record = await self._new_record(request, template, shape, warm)
        except BaseException:
            if warm is not None:
                await warm.resources.run()
            raise
        if pool is not None and warm is not None:
            return await manager.bring_up(record, lambda c: pool.provision(record, warm, c))
        return await manager.bring_up(record, lambda c: self._provision(record, template, c))

    async def _new_record(
        self, request: CreateRequest, template: Template, shape: Shape, warm: WarmVm | None
    ) -> SandboxRecord:
        return await self.manager.new_record(
            template_id=template.template_id,
            alias=template.alias,
            timeout=self.manager.clamp_timeout(request.timeout),
            vcpus=shape.vcpus,
            memory_mb=shape.memory_mb,
            metadata=request.metadata,
            env_vars=request.env_vars,
            guest=guest_config(template),
            auto_pause=request.auto_pause,
            auto_pause_memory=request.auto_pause_memory,
            allow_internet=request.allow_internet,
            secure=request.secure,
            reserved=(warm.sandbox_id, warm.slot) if warm is not None else None,
        )

    async def _provision(
        self, record: SandboxRecord, template: Template, cleanup: CleanupStack
    ) -> None:
        manager = self.manager
        await manager.make_disk(record, template, cleanup)
        await manager.make_network(record, cleanup)
        crash_point("create.network")
        await manager.start_fresh_guest(record, manager.kit, cleanup)
