"""A VMM driver that starts no guest: a hollow node's (tests, benchmarks), and the base of
the unit tests' fake. VMs are numbers in a table; disks and saved states are small files
where the runtime looks for them, so everything above runs its real code."""

from __future__ import annotations

import itertools
from pathlib import Path

from .driver import BalloonStats, Launched, PreparedVm, VmHandle, VmSpec

# What a hollow pause writes, and what a restore of the VM's own state renames it to.
VMSTATE, CONSUMED = "vmstate", "vmstate.consumed"


class HollowDriver:
    """Boots, pauses and restores in memory, as fast as a dictionary."""

    name = "hollow"
    version = "hollow 1"
    returns_free_pages = True

    def __init__(self) -> None:
        self.alive: dict[int, Path] = {}
        # Balloon targets by pid, as set.
        self.balloons: dict[int, int] = {}
        self.frozen: set[int] = set()
        self._pids = itertools.count(1000)

    async def _step(self, op: str) -> None:
        """Where a subclass waits or fails on purpose; a hollow VM never does."""

    def _handle(self, spec: VmSpec) -> VmHandle:
        pid = next(self._pids)
        self.alive[pid] = spec.workdir
        return VmHandle(driver=self.name, pid=pid, workdir=str(spec.workdir), accel=self.name)

    async def create_disk(
        self, path: Path, size: int | None, backing: Path | None, backing_format: str
    ) -> None:
        # Only a qcow2 header's magic and virtual size, which the runtime reads.
        path.write_bytes(b"QFI\xfb" + bytes(20) + (size or 1).to_bytes(8, "big"))

    async def boot(self, spec: VmSpec) -> VmHandle:
        await self._step("boot")
        return self._handle(spec)

    async def restore(
        self, spec: VmSpec, snapshot_dir: Path, launched: Launched | None = None
    ) -> VmHandle:
        return await self.finish_restore(await self.prepare_restore(spec, snapshot_dir), launched)

    async def prepare_restore(self, spec: VmSpec, snapshot_dir: Path) -> PreparedVm:
        in_place = not (snapshot_dir / "memory").exists()
        return PreparedVm(self._handle(spec), snapshot_dir, in_place)

    async def finish_restore(
        self, prepared: PreparedVm, launched: Launched | None = None
    ) -> VmHandle:
        handle, snapshot_dir = prepared.handle, prepared.snapshot_dir
        if launched is not None:
            await launched(handle)
        try:
            await self._step("load")  # the device state loads; the guest has not run
            if prepared.in_place:
                (snapshot_dir / VMSTATE).rename(snapshot_dir / CONSUMED)
            await self._step("restore")  # the guest runs
        except BaseException:
            await self.stop(handle)
            raise
        return handle

    async def stop(self, handle: VmHandle) -> None:
        self.alive.pop(handle.pid, None)
        self.frozen.discard(handle.pid)

    async def discard(self, handle: VmHandle) -> None:
        await self.stop(handle)

    def is_alive(self, handle: VmHandle) -> bool:
        return handle.pid in self.alive

    def running_vms(self, root: Path) -> dict[Path, int]:
        return {workdir: pid for pid, workdir in self.alive.items() if workdir.parent == root}

    async def kill_pid(self, pid: int) -> None:
        self.alive.pop(pid, None)

    def reclaim_control_files(self) -> int:
        return 0

    async def pause(self, handle: VmHandle, snapshot_dir: Path) -> None:
        self.frozen.add(handle.pid)
        await self._step("pause")
        snapshot_dir.mkdir(parents=True, exist_ok=True)
        (snapshot_dir / VMSTATE).write_text("device state")

    async def freeze(self, handle: VmHandle) -> None:
        self.frozen.add(handle.pid)
        await self._step("freeze")

    async def resume(self, handle: VmHandle) -> None:
        self.frozen.discard(handle.pid)

    def saved_state_intact(self, snapshot_dir: Path) -> bool:
        return (snapshot_dir / VMSTATE).is_file()

    def trim_log(self, handle: VmHandle) -> None:
        return None

    async def set_balloon(self, handle: VmHandle, target_mb: int) -> None:
        self.balloons[handle.pid] = target_mb

    async def balloon(self, handle: VmHandle) -> BalloonStats:
        return BalloonStats(actual_mb=self.balloons.get(handle.pid, 0))
