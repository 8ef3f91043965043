"""The TTL sweeper: expired sandboxes are killed (or paused), dead ones removed."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ..errors import Conflict, NotFound
from ..vmm.driver import VmHandle
from .lifecycle import EXPIRES
from .manager import SandboxManager, now

log = logging.getLogger(__name__)


async def sweep_once(manager: SandboxManager) -> None:
    """Kill expired sandboxes (pause those created with autoPause); forget dead ones."""
    for record in await manager.store.list():
        if record.state not in EXPIRES:
            continue
        expired = record.end_at <= now()
        handle = VmHandle.from_dict(record.vm) if record.vm is not None else None
        dead = handle is not None and not manager.driver.is_alive(handle)
        if not (expired or dead):
            continue
        if dead:
            log.warning("sandbox %s: VM exited on its own; removing it", record.sandbox_id)
        with contextlib.suppress(NotFound, Conflict):
            if record.auto_pause and not dead:
                await manager.pause(record.sandbox_id)
            else:
                await manager.kill(record.sandbox_id)


async def run_sweeper(manager: SandboxManager, interval: float = 1.0) -> None:
    """Sweep every `interval` seconds until cancelled; a failed pass is logged, not fatal."""
    while True:
        try:
            await sweep_once(manager)
        except Exception:
            log.exception("sweeper pass failed")
        await asyncio.sleep(interval)
