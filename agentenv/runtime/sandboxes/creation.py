"""Creating a sandbox from a template: from a warm VM of the warm pool when one matches,
else provisioned from nothing (disk, network, a VM restored from the boot snapshot or
booted)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ...crashpoints import crash_point
from ...errors import InvalidInput
from ...images.catalog import Template
from ...state.sandboxes import SandboxOptions, SandboxRecord
from ..machine.bootsnap import Shape
from ..machine.cleanup import CleanupStack
from ..machine.guestconfig import guest_config
from .machines import disk_demand_mb
from .manager import SandboxManager
from .warmpool import WarmPool


@dataclass
class CreateRequest:
    """One create, whatever asked for it: the API, a template build, a snapshot's user."""

    template_id: str
    timeout: int
    options: SandboxOptions = field(default_factory=SandboxOptions)
    # A size of its own (a template build's cpuCount and memoryMB, a create's cpuCount);
    # None: the template's.
    vcpus: int | None = None
    memory_mb: int | None = None


async def requested_record(
    manager: SandboxManager,
    request: CreateRequest,
    *,
    template_id: str,
    alias: str | None,
    shape: Shape,
    guest: dict[str, Any],
    layers: dict[str, str] | None = None,
    reserved: tuple[str, int] | None = None,
    disk_mb: int | None = None,
) -> SandboxRecord:
    """A new record for a create request, its timeout clamped (the sandbox from a template
    here, or from a snapshot); `disk_mb` is its disk's demand (else the default). A size
    the request asks for that this node can never run is the caller's error (400)."""
    most = manager.intake.capacity.max_vcpus
    if request.vcpus is not None and request.vcpus > most:
        raise InvalidInput(f"cpuCount: at most {most} vCPUs here, {request.vcpus} asked")
    return await manager.intake.new_record(
        template_id=template_id,
        alias=alias,
        timeout=manager.intake.clamp_timeout(request.timeout),
        shape=shape,
        guest=guest,
        options=request.options,
        layers=layers,
        reserved=reserved,
        disk_mb=disk_mb,
    )


class SandboxCreations:
    """`create` for the sandboxes of one manager."""

    def __init__(self, manager: SandboxManager, pool: WarmPool | None = None) -> None:
        self.manager = manager
        self.pool = pool

    async def create(self, request: CreateRequest) -> SandboxRecord:
        """Start a sandbox; on any failure every acquired resource is released again."""
        manager = self.manager
        template = await asyncio.to_thread(manager.machines.catalog.resolve, request.template_id)
        sandbox = manager.cfg.sandbox
        shape = Shape(
            request.vcpus or template.vcpus or sandbox.vcpus,
            request.memory_mb or template.memory_mb or sandbox.memory_mb,
        )
        disk_mb = await asyncio.to_thread(disk_demand_mb, template, sandbox.disk_size_mb)
        pool = self.pool
        warm = pool.take(template.template_id, shape) if pool is not None else None
        try:
            record = await requested_record(
                manager,
                request,
                template_id=template.template_id,
                alias=template.alias,
                shape=shape,
                guest=guest_config(template),
                reserved=(warm.sandbox_id, warm.slot) if warm is not None else None,
                disk_mb=disk_mb,
            )
        except BaseException:
            if warm is not None:
                await warm.resources.run()
            raise
        if pool is not None and warm is not None:
            return await manager.bring_up(record, lambda c: pool.provision(record, warm, c))
        return await manager.bring_up(record, lambda c: self._provision(record, template, c))

    async def _provision(
        self, record: SandboxRecord, template: Template, cleanup: CleanupStack
    ) -> None:
        manager = self.manager
        await manager.machines.make_disk(record, template, cleanup)
        await manager.networks.make(record, cleanup)
        crash_point("create.network")
        await manager.machines.start_fresh_guest(record, manager.machines.kit, cleanup)
