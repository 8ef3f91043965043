"""Start-up: settle what a dead server left, one rule per state, then reclaim leftovers.

Every sandbox ends up running (its VM alive and continued), paused at a complete saved
state, or gone with everything it held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

from ...errors import Unavailable
from ...state.lifecycle import Event, State
from ...state.sandboxes import FILESYSTEM, SandboxRecord
from ...vmm.driver import VmHandle, VmmError
from ..sandboxes.manager import SandboxManager
from ..snapshots.named import finish_rollback

log = logging.getLogger(__name__)


class Outcome(Enum):
    RUNNING = "running"
    PAUSED = "paused"
    GONE = "gone"


@dataclass
class RecoveryReport:
    adopted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    reclaimed: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


@dataclass
class _Found:
    """One record and what is left of it: its VM, if alive, and its saved state."""

    manager: SandboxManager
    record: SandboxRecord
    vm: VmHandle | None
    saved: bool

    async def stop_vm(self) -> None:
        if self.vm is not None:
            await self.manager.driver.stop(self.vm)

    async def run_vm(self) -> Outcome:
        assert self.vm is not None
        await self.manager.driver.resume(self.vm)
        self.manager.adopt(self.record)
        return Outcome.RUNNING

    async def remove(self) -> Outcome:
        await self.manager.teardown(self.record)
        return Outcome.GONE


async def _running(found: _Found) -> Outcome:
    if found.vm is None:
        return await found.remove()
    # `cont` of a running guest changes nothing; a frozen one must not be served frozen.
    return await found.run_vm()


async def _paused(found: _Found) -> Outcome:
    if not found.saved:
        return await found.remove()
    await found.stop_vm()  # a paused VM holds no VMM (an older server kept one)
    return Outcome.PAUSED


async def _pausing(found: _Found) -> Outcome:
    """A whole saved state is a finished pause; else the guest carries on, if it can.
    A filesystem-only pause keeps just the disk: a guest still running carries on."""
    if found.record.pause_mode == FILESYSTEM and found.vm is not None:
        await found.manager.settle(found.record, Event.FAILED)
        return await found.run_vm()
    if found.saved:
        await found.stop_vm()
        await found.manager.settle(found.record, Event.DONE)
        return Outcome.PAUSED
    if found.vm is not None:
        await found.manager.settle(found.record, Event.FAILED)
        return await found.run_vm()
    return await found.remove()


async def _resuming(found: _Found) -> Outcome:
    """An untouched saved state stays paused; a consumed one lives only in its VM."""
    if found.saved:
        await found.stop_vm()
        await found.manager.settle(found.record, Event.FAILED)
        return Outcome.PAUSED
    if found.vm is None:
        await found.manager.settle(found.record, Event.LOST)
        return await found.remove()
    await found.manager.settle(found.record, Event.DONE)
    outcome = await found.run_vm()
    # The clock stood still while it was paused; the dead server may not have set it.
    with contextlib.suppress(Unavailable):
        agent = found.manager.machines.agent(found.record)
        await agent.init({}, found.record.access_token)
    return outcome


async def _checkpointing(found: _Found) -> Outcome:
    """The source of a fork was frozen for its copies: it continues."""
    if found.vm is None:
        return await found.remove()
    await found.manager.settle(found.record, Event.FAILED)
    return await found.run_vm()


async def _copying(found: _Found) -> Outcome:
    """A paused sandbox whose files were being copied is as paused as before."""
    if not found.saved:
        return await found.remove()
    await found.stop_vm()
    await found.manager.settle(found.record, Event.DONE)
    return Outcome.PAUSED


async def _rolling_back(found: _Found) -> Outcome:
    """A committed rollback is finished and left paused at its snapshot; once its files
    are in place it ends like a resume."""
    if await finish_rollback(found.manager, found.record):
        await found.manager.settle(found.record, Event.FAILED)
        return Outcome.PAUSED
    return await _resuming(found)


async def _unfinished(found: _Found) -> Outcome:
    """A create, or a kill, that never finished: everything goes (killing again retries)."""
    await found.manager.settle(found.record, Event.KILL)
    return await found.remove()


RULES: dict[State, Callable[[_Found], Awaitable[Outcome]]] = {
    State.CREATING: _unfinished,
    State.RUNNING: _running,
    State.PAUSING: _pausing,
    State.PAUSED: _paused,
    State.RESUMING: _resuming,
    State.CHECKPOINTING: _checkpointing,
    State.COPYING: _copying,
    State.ROLLING_BACK: _rolling_back,
    State.KILLING: _unfinished,
}


async def recover(manager: SandboxManager) -> RecoveryReport:
    """Apply each state's rule to every record, then sweep leftovers by kind."""
    report = RecoveryReport()
    root = manager.cfg.sandboxes_dir
    vms = manager.driver.running_vms(root)
    for record in await manager.store.list():
        workdir = manager.machines.workdir(record.sandbox_id)
        handle = VmHandle.from_dict(record.vm) if record.vm is not None else None
        pid = vms.get(workdir)
        if pid is not None and (handle is None or handle.pid != pid):
            # Started by the dead server but never recorded (it died in between).
            await manager.driver.kill_pid(pid)
            handle = None
        alive = handle is not None and manager.driver.is_alive(handle)
        saved = manager.machines.saved_state_intact(record)
        found = _Found(manager, record, handle if alive else None, saved)
        try:
            async with manager.gate.lock(record.sandbox_id):
                outcome = await RULES[record.state](found)
            if outcome is not Outcome.GONE:
                # A policy changed in config (or made by an older server) takes effect now.
                await manager.networks.apply(record)
        except (VmmError, OSError, RuntimeError) as exc:
            report.failed[record.sandbox_id] = str(exc)
            continue
        if outcome is Outcome.GONE:
            report.removed.append(record.sandbox_id)
        else:
            report.adopted.append(record.sandbox_id)
    keep = set(report.adopted) | set(report.failed)

    stray_vms = {
        w: pid for w, pid in manager.driver.running_vms(root).items() if w.name not in keep
    }
    for pid in stray_vms.values():
        await manager.driver.kill_pid(pid)
    report.reclaimed["vms"] = len(stray_vms)

    prefix = manager.cfg.net.name_prefix
    namespaces = manager.networks.namespaces
    stray_netns = [n for n in namespaces.listed(prefix) if n.removeprefix(f"{prefix}-") not in keep]
    for netns in stray_netns:
        await namespaces.destroy(netns)
    report.reclaimed["namespaces"] = len(stray_netns)

    stray_dirs = [d for d in root.iterdir() if d.name not in keep] if root.exists() else []
    for directory in stray_dirs:
        await asyncio.to_thread(shutil.rmtree, directory, True)
    report.reclaimed["workdirs"] = len(stray_dirs)

    # No fork is under way before the server serves: every checkpoint is a dead one's.
    forks = (
        list(manager.machines.forks_dir().iterdir())
        if manager.machines.forks_dir().exists()
        else []
    )
    for checkpoint in forks:
        await asyncio.to_thread(shutil.rmtree, checkpoint, True)
    report.reclaimed["checkpoints"] = len(forks)
    report.reclaimed["sockets"] = await asyncio.to_thread(manager.driver.reclaim_control_files)
    log.info(
        "recovery: adopted %d, removed %d, reclaimed %s, failed %d",
        len(report.adopted), len(report.removed), report.reclaimed, len(report.failed),
    )  # fmt: skip
    return report
