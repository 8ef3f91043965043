"""The TTL sweeper: expired sandboxes are killed (or paused), dead ones removed."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ...errors import Conflict, NotFound
from ...vmm.driver import VmHandle
from ..sandboxes.intake import now
from ..snapshots.pause import SandboxPauses

log = logging.getLogger(__name__)


async def sweep_once(pauses: SandboxPauses) -> None:
    """Kill expired sandboxes (pause those created with autoPause); forget dead ones."""
    manager = pauses.manager
    for lease in await manager.store.leases():
        expired = lease.end_at <= now()
        handle = VmHandle.from_dict(lease.vm) if lease.vm is not None else None
        dead = handle is not None and not manager.driver.is_alive(handle)
        if handle is not None and not dead:
            manager.driver.trim_log(handle)
        if dead:
            # The lease may be older than an operation that stopped the VM on purpose.
            await manager.remove_dead(lease.sandbox_id)
            continue
        if not expired:
            continue
        record = await manager.store.get(lease.sandbox_id)
        if record is None:
            continue
        with contextlib.suppress(NotFound, Conflict):
            if record.auto_pause:
                await pauses.pause(record.sandbox_id, memory=record.auto_pause_memory)
            else:
                await manager.kill(record.sandbox_id)


async def run_sweeper(pauses: SandboxPauses, interval: float = 1.0) -> None:
    """Sweep every `interval` seconds until cancelled; a failed pass is logged, not fatal."""
    while True:
        try:
            await sweep_once(pauses)
        except Exception:
            log.exception("sweeper pass failed")
        await asyncio.sleep(interval)
