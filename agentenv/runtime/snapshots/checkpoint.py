"""Checkpoints: a running sandbox's device state, RAM and disk copied at one instant, and
new sandboxes started from such a copy. Forks and snapshots are both made of these.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from ...crashpoints import crash_point
from ...errors import Conflict, Unavailable
from ...guest.kit import Kit
from ...state.sandboxes import FILESYSTEM, SandboxRecord
from ...vmm import guestram
from ...vmm.driver import VmHandle, VmmError
from ...vmm.qemuimg import copy_sparse
from ..machine.cleanup import CleanupStack
from ..machine.guestconfig import init_agent
from ..sandboxes.manager import SandboxManager

DISK = "rootfs.qcow2"
MEMORY = guestram.OWN


def _copy_files(workdir: Path, state_dir: Path, dest: Path, memory: bool) -> None:
    """Blocking: a stopped VM's disk and, with `memory`, its RAM: a copy of its own file,
    or a link to the snapshot RAM it maps (the pages it wrote are in its delta)."""
    copy_sparse(workdir / DISK, dest / DISK)
    if memory:
        guestram.keep(workdir, state_dir, dest)


async def take_checkpoint(
    manager: SandboxManager, source: SandboxRecord, dest: Path, memory: bool
) -> None:
    """Copy `source` into `dest` (made here), freezing it only for the copies; it runs on
    afterwards. Without `memory` only the disk is kept, flushed by the guest first."""
    crash_point("checkpoint.begun")
    assert source.vm is not None
    handle = VmHandle.from_dict(source.vm)
    workdir = manager.machines.workdir(source.sandbox_id)
    if not memory:
        await manager.machines.flush_guest(source)
    dest.mkdir(parents=True)
    try:
        if memory:
            await manager.driver.pause(handle, dest)
        else:
            await manager.driver.freeze(handle)
        crash_point("checkpoint.frozen")
        await asyncio.to_thread(_copy_files, workdir, dest, dest, memory)
        crash_point("checkpoint.copied")
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, dest, True)
        raise
    finally:
        await manager.driver.resume(handle)


async def copy_paused(
    manager: SandboxManager, source: SandboxRecord, dest: Path, memory: bool
) -> None:
    """Copy a paused sandbox's files into `dest` (made here), as `take_checkpoint` would
    have while it ran: its disk and, with `memory`, its RAM and saved device state."""
    if memory and source.pause_mode == FILESYSTEM:
        raise Conflict(
            f"sandbox '{source.sandbox_id}' was paused without its memory: "
            "snapshot it filesystem-only, or resume it first"
        )
    if not manager.machines.local_state_intact(source):
        raise Unavailable(
            f"sandbox '{source.sandbox_id}': its files are not on this node; resume it first"
        )
    workdir = manager.machines.workdir(source.sandbox_id)
    dest.mkdir(parents=True)
    state_dir = manager.machines.snapshot_dir(source.sandbox_id)
    try:
        await asyncio.to_thread(_copy_files, workdir, state_dir, dest, memory)
        if memory:
            for path in state_dir.iterdir():
                await asyncio.to_thread(copy_sparse, path, dest / path.name)
        crash_point("checkpoint.copied")
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, dest, True)
        raise


async def provision_from_checkpoint(
    manager: SandboxManager,
    record: SandboxRecord,
    checkpoint: Path,
    kit: Kit,
    cleanup: CleanupStack,
) -> None:
    """Provision a new `record` from a checkpoint: its own copy of the disk, and the memory
    restored (or, for a filesystem-only one, a fresh guest on that disk)."""
    workdir = manager.machines.make_workdir(record, cleanup)
    await asyncio.to_thread(copy_sparse, checkpoint / DISK, workdir / DISK)
    await manager.networks.make(record, cleanup)
    if not guestram.holds_ram(checkpoint, checkpoint):
        await manager.machines.start_fresh_guest(record, kit, cleanup)
        return
    agent = manager.machines.agent(record)
    try:
        handle = await manager.machines.launcher.restore(
            manager.machines.vm_spec(record, kit), agent, checkpoint
        )
    except (VmmError, TimeoutError) as exc:
        raise Unavailable(f"sandbox could not start from its checkpoint: {exc}") from exc
    cleanup.push("vm", lambda: manager.driver.stop(handle))
    await manager.machines.save_vm(record, handle, kit)
    # A new clock reading, entropy of its own, its own access token and env vars; and
    # the defaults its template gives (a built template's final ENV, USER and WORKDIR).
    await init_agent(record, agent, manager.cfg.net.guest_gateway, manager.networks.trusted_ca)
