"""The warm pool: VMMs started ahead of demand for the default template and shape, each
with its work directory, disk, network namespace and the boot snapshot's RAM mapped,
waiting (`-incoming defer`) for nothing but the snapshot's device state. A create that
matches takes one: only loading that state, `cont` and `/init` remain.

Kept in memory, not in the state store: a warm VM is no sandbox yet. After a crash,
recovery reclaims its VMM, namespace and directory like any resource no record names.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta

from ...guest.kit import Kit
from ...images.catalog import BASE
from ...state.lifecycle import State
from ...state.sandboxes import SandboxRecord
from ...vmm.driver import PreparedVm, VmmError
from ..machine.bootsnap import Shape
from ..machine.cleanup import CleanupStack
from ..machine.guestconfig import guest_config
from ..machine.network import egress_rules
from .intake import new_sandbox_id, now
from .manager import SandboxManager

log = logging.getLogger(__name__)

# Seconds between checks that the pool is full (a boot snapshot may not be ready yet).
FILL_INTERVAL = 1.0


@dataclass
class WarmVm:
    """A pre-started VM and what it holds; `resources` undoes all of it."""

    sandbox_id: str
    slot: int
    template_id: str
    shape: Shape
    kit: Kit
    prepared: PreparedVm
    resources: CleanupStack = field(repr=False)


class WarmPool:
    """Up to `size` warm VMs of the default template and shape."""

    def __init__(self, manager: SandboxManager, size: int) -> None:
        self.manager = manager
        self.size = size
        self._ready: list[WarmVm] = []

    def take(self, template_id: str, shape: Shape) -> WarmVm | None:
        """A warm VM for `template_id` and `shape` on today's kit, now the caller's."""
        for index, vm in enumerate(self._ready):
            if (vm.template_id, vm.shape, vm.kit) == (
                template_id,
                shape,
                self.manager.machines.kit,
            ):
                return self._ready.pop(index)
        return None

    async def run(self) -> None:
        """Keep the pool full until cancelled; a failed start is logged, not fatal."""
        while True:
            try:
                while len(self._ready) < self.size and await self._add_one():
                    pass
            except Exception:
                log.exception("starting a warm VM failed")
            await asyncio.sleep(FILL_INTERVAL)

    async def close(self) -> None:
        while self._ready:
            await self._ready.pop().resources.run()

    async def _add_one(self) -> bool:
        """Start one warm VM; False while there is no boot snapshot to start it from."""
        manager = self.manager
        template = await asyncio.to_thread(manager.machines.catalog.resolve, BASE)
        sandbox = manager.cfg.sandbox
        shape = Shape(template.vcpus or sandbox.vcpus, template.memory_mb or sandbox.memory_mb)
        snapshots = manager.machines.launcher.boot_snapshots
        snapshot = snapshots.ready(shape) if snapshots is not None else None
        if snapshot is None:
            return False
        resources = CleanupStack("warm VM")
        try:
            slot = await manager.intake.hold_slot()
            resources.push("slot", lambda: manager.intake.release_slot(slot))
            # Never stored: it only names the resources a sandbox will take over.
            record = SandboxRecord(
                sandbox_id=new_sandbox_id(),
                template_id=template.template_id,
                state=State.CREATING,
                started_at=now(),
                end_at=now() + timedelta(seconds=sandbox.default_timeout),
                vcpus=shape.vcpus,
                memory_mb=shape.memory_mb,
                disk_mb=sandbox.disk_size_mb,
                slot=slot,
                guest=guest_config(template),
            )
            await manager.machines.make_disk(record, template, resources)
            await manager.networks.make(record, resources)
            kit = manager.machines.kit
            spec = manager.machines.vm_spec(record, kit)
            prepared = await manager.driver.prepare_restore(spec, snapshot)
            resources.push("vm", lambda: manager.driver.stop(prepared.handle))
        except BaseException:
            await resources.run()
            raise
        vm = WarmVm(record.sandbox_id, slot, template.template_id, shape, kit, prepared, resources)
        self._ready.append(vm)
        log.info("warm VM %s ready (%d of %d)", vm.sandbox_id, len(self._ready), self.size)
        return True

    async def provision(self, record: SandboxRecord, vm: WarmVm, cleanup: CleanupStack) -> None:
        """Provision `record` (stored with `vm`'s id and slot) from the warm VM."""
        manager = self.manager
        cleanup.push("warm VM", vm.resources.run)
        # The stored record holds the network slot from here on.
        await manager.intake.release_slot(vm.slot)
        if not egress_rules(record).unrestricted:
            await manager.networks.apply(record)
        agent = manager.machines.agent(record)
        try:
            handle = await manager.machines.launcher.finish(
                vm.prepared, agent, launched=lambda h: manager.machines.save_vm(record, h, vm.kit)
            )
        except (VmmError, TimeoutError) as exc:
            raise VmmError(f"the warm VM did not start: {exc}") from exc
        cleanup.push("vm", lambda: manager.driver.stop(handle))
        await manager.machines.initialize_guest(record, agent)
