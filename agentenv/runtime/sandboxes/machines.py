"""A node's sandboxes as machines: each one's work directory, disk, VM and guest agent.

Nothing here changes a sandbox's state: the manager's lifecycle calls these as steps.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
from pathlib import Path

import httpx

from ...config import Config
from ...crashpoints import crash_point
from ...errors import PermanentlyUnavailable, Unavailable
from ...guest.client import AgentClient
from ...guest.ext4 import filesystem_bytes
from ...guest.kit import Kit, guest_args, load_kit
from ...guest.rpc import ConnectError
from ...images.catalog import Template, TemplateCatalog
from ...state.sandboxes import FILESYSTEM, SandboxRecord, SandboxStore
from ...vmm import guestram
from ...vmm.driver import VmHandle, VmmError, VmSpec
from ...vmm.qemuimg import qcow2_virtual_size
from ...wire import ENVD_PORT
from ..machine.bootsnap import (
    DISK_BYTES,
    BootSnapshots,
    Shape,
    read_init_secret,
    sandbox_vm,
    write_init_secret,
)
from ..machine.cleanup import CleanupStack
from ..machine.guestconfig import init_agent
from ..machine.host import MachineHost
from ..machine.launch import VmLauncher
from ..machine.network import SandboxNetworks

log = logging.getLogger(__name__)


def guest_kernel_args(cfg: Config) -> str:
    """The same for every sandbox (each has its own namespace), so snapshots can be shared."""
    net = cfg.net
    # The gateway answers DNS: the namespace forwards it to the configured resolver.
    return guest_args(net.guest_ip, net.guest_prefix, net.guest_gateway, dns=net.guest_gateway)


class SandboxMachines:
    """Work directories, disks, VMs and agents of a node's sandboxes."""

    def __init__(
        self,
        cfg: Config,
        store: SandboxStore,
        host: MachineHost,
        kit: Kit,
        catalog: TemplateCatalog,
        networks: SandboxNetworks,
        boot_snapshots: BootSnapshots | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.driver = host.driver
        self._agents = host.agents
        self.kit = kit
        self.catalog = catalog
        self.networks = networks
        self.launcher = VmLauncher(cfg.sandbox, host.driver, boot_snapshots)

    def workdir(self, sandbox_id: str) -> Path:
        return self.cfg.sandboxes_dir / sandbox_id

    def snapshot_dir(self, sandbox_id: str) -> Path:
        return self.workdir(sandbox_id) / "snapshot"

    def forks_dir(self) -> Path:
        return self.cfg.home / "forks"

    def agent(self, record: SandboxRecord) -> AgentClient:
        return self._agents(
            f"http://{self.networks.plan(record).ns_ip}:{ENVD_PORT}",
            record.access_token,
            init_secret=read_init_secret(self.workdir(record.sandbox_id)),
            reclaim_after_idle=self.cfg.sandbox.reclaim_after_idle,
        )

    def make_workdir(self, record: SandboxRecord, cleanup: CleanupStack) -> Path:
        workdir = self.workdir(record.sandbox_id)
        workdir.mkdir(parents=True)
        cleanup.push("workdir", lambda: asyncio.to_thread(shutil.rmtree, workdir, True))
        write_init_secret(workdir)
        return workdir

    async def make_disk(
        self, record: SandboxRecord, template: Template, cleanup: CleanupStack
    ) -> None:
        """The sandbox's work directory and its disk over the template's image."""
        overlay = self.make_workdir(record, cleanup) / "rootfs.qcow2"
        # Every disk gets the boot snapshots' size when its image fits (the guest sees it).
        size = DISK_BYTES if _disk_size(template) <= DISK_BYTES else None
        try:
            await self.driver.create_disk(overlay, size, template.rootfs, template.rootfs_format)
        except VmmError as exc:
            raise Unavailable(str(exc)) from exc

    def vm_spec(self, record: SandboxRecord, kit: Kit) -> VmSpec:
        return sandbox_vm(
            kit,
            f"aenv-{record.sandbox_id}",
            Shape(record.vcpus, record.memory_mb),
            self.workdir(record.sandbox_id) / "rootfs.qcow2",
            self.workdir(record.sandbox_id),
            guest_kernel_args(self.cfg),
            self.networks.plan(record).netns,
        )

    async def start_fresh_guest(
        self, record: SandboxRecord, kit: Kit, cleanup: CleanupStack
    ) -> None:
        """A guest that has not run before (the boot snapshot's, or booted) on the sandbox's
        disk, given the sandbox's environment; its VM's undo goes onto `cleanup`."""
        agent = self.agent(record)
        disk = self.workdir(record.sandbox_id) / "rootfs.qcow2"
        restorable = await asyncio.to_thread(qcow2_virtual_size, disk) == DISK_BYTES
        handle = await self.launcher.start(self.vm_spec(record, kit), agent, restorable)
        cleanup.push("vm", lambda: self.driver.stop(handle))
        crash_point("create.vm")
        await self.save_vm(record, handle, kit)
        await self.initialize_guest(record, agent)

    async def initialize_guest(self, record: SandboxRecord, agent: AgentClient) -> None:
        """Give a guest that has not run before the sandbox's environment and command."""
        guest = record.guest
        await init_agent(record, agent, self.cfg.net.guest_gateway, self.networks.trusted_ca)
        crash_point("create.initialized")
        if guest.get("command"):
            try:
                await agent.start_detached(guest["command"], tag="entrypoint")
            except (httpx.HTTPError, ConnectError) as exc:
                # The sandbox is usable without it; the image's command is a convenience.
                log.warning("sandbox %s: image command failed to start: %s", record.sandbox_id, exc)

    async def save_vm(self, record: SandboxRecord, handle: VmHandle, kit: Kit) -> None:
        # The kit is pinned: a paused guest has its runtime disk mounted and must get it back.
        handle.extra["kit"] = kit.version
        record.vm = handle.to_dict()
        await self.store.update(record.sandbox_id, vm=record.vm)

    def pinned_kit(self, record: SandboxRecord) -> Kit:
        """The kit a sandbox's guest runs on (a restored kernel keeps its runtime disk)."""
        return self.kit_version((record.vm or {}).get("extra", {}).get("kit", self.kit.version))

    def kit_version(self, version: str) -> Kit:
        kit = self.kit if version == self.kit.version else load_kit(self.cfg, version)
        if kit is None:
            raise PermanentlyUnavailable(
                f"kit {version}, which this guest's memory was saved with, is gone"
            )
        return kit

    async def flush_guest(self, record: SandboxRecord) -> None:
        """The guest writes its dirty file data to its disk; 503 when its agent is silent."""
        try:
            await self.agent(record).sync()
        except Unavailable as exc:
            raise Unavailable(
                f"sandbox '{record.sandbox_id}': its guest agent did not answer, so its "
                f"file systems cannot be flushed for a filesystem-only snapshot: {exc}"
            ) from exc

    def saved_state_intact(self, record: SandboxRecord) -> bool:
        """Whether a paused sandbox's files are a whole pause of the kind it recorded,
        here or (uploaded) in the object store."""
        return record.stored or self.local_state_intact(record)

    def local_state_intact(self, record: SandboxRecord) -> bool:
        """Whether this node holds a paused sandbox's files, whole."""
        workdir = self.workdir(record.sandbox_id)
        if record.pause_mode == FILESYSTEM:
            return (workdir / "rootfs.qcow2").is_file()
        snapshot = self.snapshot_dir(record.sandbox_id)
        return self.driver.saved_state_intact(snapshot) and guestram.holds_ram(workdir, snapshot)


def disk_demand_mb(template: Template, default_mb: int) -> int:
    """The disk a sandbox of `template` may fill, for admission: the template's filesystem
    where a build grew it past the default (E2B's minFreeDiskMb), else the default."""
    if template.rootfs_format != "raw":
        return default_mb
    stat = template.rootfs.stat()
    return max(default_mb, _filesystem_mb(str(template.rootfs), stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=256)
def _filesystem_mb(path: str, size: int, mtime_ns: int) -> int:
    """A disk's filesystem size, read once per version of the file (creates ask often; a
    served template's first block may come from the object store)."""
    return (filesystem_bytes(Path(path)) or 0) >> 20


def _disk_size(template: Template) -> int:
    """Virtual size of a template's disk; qcow2 images never take the snapshot path."""
    if template.rootfs_format != "raw":
        return DISK_BYTES + 1
    return template.rootfs.stat().st_size
