"""The one interface every VMM driver (QEMU, Firecracker) implements for the runtime."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import DependencyFailed


@dataclass(frozen=True)
class VmSpec:
    """Everything a driver needs to boot one sandbox VM."""

    name: str
    vcpus: int
    memory_mb: int
    kernel: Path
    initrd: Path
    # Disks in order; the guest finds them by filesystem label, not by position.
    disks: tuple[DiskSpec, ...]
    # Directory the VM owns: memory file, control socket, console log.
    workdir: Path
    kernel_args: str = ""
    # Network namespace and tap device the VM's NIC attaches to (None: no NIC).
    netns: str | None = None
    tap: str | None = None
    mac: str = "02:fc:00:00:00:05"
    # (name, host file) pairs the guest reads out of band of its network (QEMU: fw_cfg).
    guest_files: tuple[tuple[str, Path], ...] = ()


@dataclass(frozen=True)
class DiskSpec:
    path: Path
    format: str = "raw"
    read_only: bool = False


@dataclass
class VmHandle:
    """What identifies a running VM; persisted so a restarted server can re-adopt it."""

    driver: str
    pid: int
    workdir: str
    accel: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VmHandle:
        return cls(**data)

    @property
    def console_log(self) -> Path:
        return Path(self.workdir) / "console.log"


@dataclass
class PreparedVm:
    """A VMM started for a saved state and waiting for it: nothing loaded, no guest run."""

    handle: VmHandle
    snapshot_dir: Path
    # Restoring the VM's own state (consumed as its guest starts), not a snapshot's.
    in_place: bool
    # Guest pages to write into the VMM before the state loads, if any.
    pages: Path | None = None


@dataclass(frozen=True)
class BalloonStats:
    """A VM's balloon: the memory it leaves the guest, and what the guest reports (None
    until its driver has reported once). Sizes in MiB."""

    actual_mb: int
    total_mb: int | None = None
    free_mb: int | None = None
    available_mb: int | None = None
    disk_caches_mb: int | None = None


# Told of a restoring VM's handle before its guest can run, so a crash never leaves a
# running guest that nobody recorded.
Launched = Callable[[VmHandle], Awaitable[None]]


class VmmError(DependencyFailed):
    """A VMM operation failed; the message names the step. A client gets 503."""

    part = "the VMM"


class VmmDriver(Protocol):
    """Boot, stop, pause/snapshot, restore and balloon: the runtime sees nothing else."""

    name: str
    # The VMM's name and version: saved states load only into the version that wrote them.
    version: str

    async def create_disk(
        self, path: Path, size: int | None, backing: Path | None, backing_format: str
    ) -> None:
        """A disk for a VM at `path` in the VMM's format: empty, or copy-on-write over
        `backing`; `size` in bytes, None: the backing file's."""
        ...

    async def boot(self, spec: VmSpec) -> VmHandle:
        """Start the VM; returns once the VMM is up (not the guest)."""
        ...

    async def stop(self, handle: VmHandle) -> None:
        """Stop the VM and reap its VMM process; idempotent."""
        ...

    async def discard(self, handle: VmHandle) -> None:
        """`stop` for a VM whose disk and RAM nobody reads again: killed at once, with no
        orderly exit (which would flush caches into a disk about to be deleted)."""
        ...

    def is_alive(self, handle: VmHandle) -> bool:
        """True while the VMM process for `handle` exists."""
        ...

    def running_vms(self, root: Path) -> dict[Path, int]:
        """VMM processes of this driver whose workdir lies under `root`, by workdir."""
        ...

    async def kill_pid(self, pid: int) -> None:
        """Stop a VMM process known only by pid (a leftover from an earlier server)."""
        ...

    def reclaim_control_files(self) -> int:
        """Remove control files (sockets) that VMMs which died left behind; how many."""
        ...

    async def pause(self, handle: VmHandle, snapshot_dir: Path) -> None:
        """Freeze the guest and write its device state to `snapshot_dir`, which holds it
        only once it is whole; the VM stays stopped."""
        ...

    async def freeze(self, handle: VmHandle) -> None:
        """Stop the guest's CPUs and drain its disk I/O, saving nothing; `resume` undoes it."""
        ...

    async def resume(self, handle: VmHandle) -> None:
        """Let a paused (or frozen) VM run again."""
        ...

    async def restore(
        self, spec: VmSpec, snapshot_dir: Path, launched: Launched | None = None
    ) -> VmHandle:
        """Start `spec` from the device state `pause` wrote to `snapshot_dir`, and the RAM
        in `snapshot_dir` if there is one there (a clone), else the VM's own; running on
        return. Restoring a VM's own RAM consumes the saved state as the guest starts."""
        ...

    async def prepare_restore(self, spec: VmSpec, snapshot_dir: Path) -> PreparedVm:
        """The first half of `restore`: the VMM started and waiting, its RAM mapped."""
        ...

    async def finish_restore(
        self, prepared: PreparedVm, launched: Launched | None = None
    ) -> VmHandle:
        """The second half of `restore`: the saved state loaded and the guest running; the
        VMM is stopped again if that fails."""
        ...

    def saved_state_intact(self, snapshot_dir: Path) -> bool:
        """True while `snapshot_dir` holds a whole saved state no guest has run from."""
        ...

    def trim_log(self, handle: VmHandle) -> None:
        """Cut the VMM's own log back when it outgrew its limit (a guest can make its VMM
        log errors as fast as it likes)."""
        ...

    @property
    def returns_free_pages(self) -> bool:
        """Free memory the guest reports (free page reporting) goes back to the host."""
        ...

    async def set_balloon(self, handle: VmHandle, target_mb: int) -> None:
        """Ask the guest to shrink (or grow back) to `target_mb` of RAM; the pages it
        gives up go back to the host."""
        ...

    async def balloon(self, handle: VmHandle) -> BalloonStats:
        """The balloon's size and the guest's memory statistics."""
        ...
