"""Pause and resume: a paused sandbox holds its files (disk, and with a full pause its RAM
and device state), no VMM, memory or CPU. Every step runs under the manager's `operate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from datetime import timedelta
from functools import partial

import httpx

from ...crashpoints import crash_point
from ...errors import (
    AenvError,
    GuestUnresponsiveAtPause,
    NotFound,
    PermanentlyUnavailable,
    Unavailable,
)
from ...state.lifecycle import Event, allows
from ...state.sandboxes import FILESYSTEM, FULL, SandboxRecord
from ...storage.objectstore import ObjectStore, ObjectStoreError
from ...vmm import guestram
from ...vmm.driver import VmHandle, VmmError
from ..machine.bootsnap import read_init_secret, write_init_secret
from ..machine.cleanup import CleanupStack
from ..machine.guestconfig import disk_template
from ..sandboxes.intake import now
from ..sandboxes.manager import GuestLost, SandboxManager
from ..sandboxes.routes import Route
from .persist import fetch_files
from .servedram import RamServer

log = logging.getLogger(__name__)


# An agent that answered the proxy this recently (seconds) is not asked again by a pause.
AGENT_ANSWERED_LATELY = 2.0


class SandboxPauses:
    """`pause`, `connect` and `resume` for the sandboxes of one manager."""

    def __init__(self, manager: SandboxManager, objects: ObjectStore, ram: RamServer) -> None:
        self.manager = manager
        self.machines = manager.machines
        self.objects = objects
        self.ram = ram

    async def pause(
        self, sandbox_id: str, memory: bool = True, require_healthy_guest: bool = False
    ) -> None:
        """Save the guest's device state next to its RAM file and stop its VMM: a paused
        sandbox holds disk, not memory or CPU, until it is resumed. Without `memory` only
        the disk is kept (flushed by the guest first) and a resume starts a fresh guest.
        A silent guest agent is 503 with `require_healthy_guest` or without `memory`;
        else the pause goes on and is marked, and only a resume without memory undoes it."""

        # Read before the pause begins: a pausing sandbox has no route.
        route = self.manager.routes.get(sandbox_id)
        answered = route is not None and route.agent.answered_within(AGENT_ANSWERED_LATELY)

        async def body(record: SandboxRecord) -> None:
            answers = answered or await self.machines.agent(record).healthy()
            if not answers and (require_healthy_guest or not memory):
                raise Unavailable(f"sandbox '{sandbox_id}': its guest agent does not answer")
            await self._pause(record, FULL if memory else FILESYSTEM, not answers)

        await self.manager.operate(sandbox_id, Event.PAUSE, body)
        log.info("sandbox %s paused (%s)", sandbox_id, FULL if memory else FILESYSTEM)

    async def _pause(self, record: SandboxRecord, mode: str, unresponsive: bool) -> None:
        crash_point("pause.begun")
        assert record.vm is not None
        handle = VmHandle.from_dict(record.vm)
        if mode == FILESYSTEM:
            await self.machines.flush_guest(record)
        # Recorded first: recovery reads from it what a whole pause must have kept.
        record.pause_mode = mode
        record.agent_unresponsive_at_pause = unresponsive
        await self.manager.store.update(
            record.sandbox_id, pause_mode=mode, agent_unresponsive_at_pause=unresponsive
        )
        if mode == FILESYSTEM:
            await self.manager.driver.stop(handle)
            crash_point("pause.stopped")
            await asyncio.to_thread(self._drop_memory, record)
            return
        try:
            await self.manager.driver.pause(handle, self.machines.snapshot_dir(record.sandbox_id))
        except BaseException:
            with contextlib.suppress(VmmError, OSError):
                await self.manager.driver.resume(handle)
            raise
        crash_point("pause.saved")
        await self.manager.driver.stop(handle)
        crash_point("pause.stopped")

    def _drop_memory(self, record: SandboxRecord) -> None:
        """Forget a stopped guest's RAM and device state: only its disk is kept."""
        shutil.rmtree(self.machines.snapshot_dir(record.sandbox_id), ignore_errors=True)
        guestram.drop(self.machines.workdir(record.sandbox_id))

    async def connect(
        self, sandbox_id: str, timeout: int, memory: bool = True
    ) -> tuple[SandboxRecord, bool]:
        """Resume a paused sandbox (True) or keep a running one (False); extends its life."""
        record = await self.manager.get(sandbox_id)
        if not allows(record.state, Event.RESUME):
            async with self.manager.gate.lock(sandbox_id):  # waits out an operation under way
                record = await self.manager.get(sandbox_id)
                if not allows(record.state, Event.RESUME):
                    wanted_end = now() + timedelta(
                        seconds=self.manager.intake.clamp_timeout(timeout)
                    )
                    if wanted_end > record.end_at:
                        record.end_at = wanted_end
                        await self.manager.store.update(sandbox_id, end_at=wanted_end)
                    return record, False
        return await self.resume(sandbox_id, timeout, memory), True

    async def wake_on_traffic(self, sandbox_id: str) -> Route | None:
        """Resume a paused sandbox that asked to be woken by traffic (`auto_resume`); its
        route then, else None. It gets the default timeout, as a connect without one."""
        try:
            record = await self.manager.get(sandbox_id)
        except NotFound:
            return None
        if not (record.auto_resume and allows(record.state, Event.RESUME)):
            return None
        try:
            await self.connect(sandbox_id, self.manager.cfg.sandbox.default_timeout)
        except AenvError as exc:
            log.warning("sandbox %s: traffic could not wake it: %s", sandbox_id, exc.message)
            return None
        log.info("sandbox %s woken by traffic", sandbox_id)
        return self.manager.routes.get(sandbox_id)

    async def resume(self, sandbox_id: str, timeout: int, memory: bool = True) -> SandboxRecord:
        """A paused sandbox's guest continues where it stopped; 409 unless it is paused.
        Without `memory` (or after a filesystem-only pause) a fresh guest starts on its disk."""
        wanted_end = now() + timedelta(seconds=self.manager.intake.clamp_timeout(timeout))

        async def restore(record: SandboxRecord) -> SandboxRecord:
            await self.wake(record, memory)
            record.end_at = wanted_end
            await self.manager.store.update(sandbox_id, end_at=wanted_end)
            return record

        record = await self.manager.operate(sandbox_id, Event.RESUME, restore, admit_memory=True)
        log.info("sandbox %s resumed", sandbox_id)
        return record

    async def wake(self, record: SandboxRecord, memory: bool = True) -> None:
        """Run a paused sandbox again: its memory restored, or, without `memory` or after a
        filesystem-only pause, a fresh guest on its disk. Files this node does not hold
        are fetched from the object store first."""
        if memory and record.saved_unresponsive_agent:
            raise GuestUnresponsiveAtPause(
                f"sandbox '{record.sandbox_id}' was paused while its guest agent did not "
                "answer, and its memory would bring that back: resume it with `memory: false`"
                " (a fresh guest on its disk)"
            )
        if record.stored and not self.machines.local_state_intact(record):
            await self._fetch(record)
        if record.stored:
            # The files change from here on: the stored layers become the next upload's parents.
            record.stored = False
            await self.manager.store.update(record.sandbox_id, stored=False)
        await self.manager.networks.ensure(record)
        if memory and record.pause_mode != FILESYSTEM:
            await self._restore_paused(record)
        else:
            await self._restart_paused(record)

    async def _fetch(self, record: SandboxRecord) -> None:
        workdir = self.machines.workdir(record.sandbox_id)
        await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
        if read_init_secret(workdir) is None:
            write_init_secret(workdir)
        try:
            # Its disk sits on the template's image, served here too from now on.
            template = await asyncio.to_thread(self.machines.catalog.resolve, disk_template(record))
            await asyncio.to_thread(
                partial(
                    fetch_files,
                    self.objects,
                    record.layers,
                    workdir,
                    self.machines.snapshot_dir(record.sandbox_id),
                    # The sandbox's own files from now on, whatever happens to the host.
                    durable=True,
                    ram=self.ram,
                    template=template,
                )
            )
        except NotFound as exc:
            raise PermanentlyUnavailable(f"sandbox {record.sandbox_id}: {exc}") from exc
        except (ObjectStoreError, OSError, VmmError) as exc:
            raise Unavailable(
                f"sandbox {record.sandbox_id}: fetching its files failed: {exc}"
            ) from exc
        crash_point("resume.fetched")
        log.info("sandbox %s: fetched its files from the object store", record.sandbox_id)

    async def _restore_paused(self, record: SandboxRecord) -> None:
        """A new VMM from the paused sandbox's own files; the guest continues where it was."""
        crash_point("resume.begun")
        assert record.vm is not None
        # A VMM still there (paused in place by an older server) would hold the tap.
        await self.manager.driver.stop(VmHandle.from_dict(record.vm))
        kit = self.machines.pinned_kit(record)
        spec = self.machines.vm_spec(record, kit)
        snapshot = self.machines.snapshot_dir(record.sandbox_id)
        agent = self.machines.agent(record)
        try:
            handle = await self.machines.launcher.restore(
                spec,
                agent,
                snapshot,
                launched=lambda vm: self.machines.save_vm(record, vm, kit),
            )
            crash_point("resume.restored")
            try:
                # The guest's clock stood still while it was paused; /init sets it again.
                await agent.init({}, record.access_token)
            except BaseException:
                await self.manager.driver.stop(handle)
                raise
        except (VmmError, TimeoutError, httpx.HTTPError, Unavailable) as exc:
            if not self.manager.driver.saved_state_intact(snapshot):
                raise GuestLost(
                    f"sandbox {record.sandbox_id} failed after its guest resumed: {exc}"
                ) from exc
            raise Unavailable(f"sandbox {record.sandbox_id} could not be resumed: {exc}") from exc
        crash_point("resume.initialized")

    async def _restart_paused(self, record: SandboxRecord) -> None:
        """A fresh guest on the paused sandbox's disk; any saved memory is dropped first."""
        crash_point("resume.begun")
        assert record.vm is not None
        await self.manager.driver.stop(VmHandle.from_dict(record.vm))
        if record.pause_mode != FILESYSTEM:
            # From here on the sandbox is paused at its disk alone, whatever happens next.
            record.pause_mode = FILESYSTEM
            await self.manager.store.update(record.sandbox_id, pause_mode=FILESYSTEM)
        await asyncio.to_thread(self._drop_memory, record)
        cleanup = CleanupStack(f"restart sandbox {record.sandbox_id}")
        try:
            # A fresh guest runs on today's kit: nothing of the old one is mounted.
            await self.machines.start_fresh_guest(record, self.machines.kit, cleanup)
        except BaseException as exc:
            await cleanup.run()
            if isinstance(exc, (VmmError, TimeoutError, httpx.HTTPError)):
                raise Unavailable(f"sandbox {record.sandbox_id} could not restart: {exc}") from exc
            raise
        cleanup.dismiss()
        crash_point("resume.initialized")
