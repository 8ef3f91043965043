"""Boot snapshots: a guest booted once per VM shape and saved with its agent listening.

A sandbox is then restored from the snapshot instead of booting: the kernel and the agent
are already up, and the agent attaches the sandbox's own disk on `/init`. Every sandbox's
disk has the same virtual size (`DISK_BYTES`), since the guest saw that size at boot.
Snapshots are machine-local cache, keyed by everything the saved guest depends on, built
in the background on first need and shared by the servers of one host.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...guest.agent import init_secret
from ...guest.kit import Kit
from ...net.netns import TAP_NAME, create_detached_tap, destroy_network
from ...vmm.driver import DiskSpec, VmmDriver, VmmError, VmSpec
from ...vmm.qemuimg import create_qcow2

log = logging.getLogger(__name__)

# Virtual size of every sandbox disk: ext4 inside may be smaller; a bigger image boots cold.
DISK_BYTES = 64 * 2**30
# The agent's log line once it serves requests (it reaches the serial console).
AGENT_READY = b"aenv agent listening"
# Bump when what a snapshot holds changes in a way the key does not capture.
FORMAT = 5
# In a VM's workdir: the host's /init secret, which the guest reads through its VMM.
INIT_SECRET_FILE = "init-secret"


@dataclass(frozen=True)
class Shape:
    """What differs between snapshots of one kit: the VM's size."""

    vcpus: int
    memory_mb: int


def _finished(root: Path) -> dict[Path, dict[str, Any]]:
    """Every finished snapshot under `root`, with its `meta.json`."""
    found = {}
    for meta in sorted(root.glob("*/meta.json")):
        with contextlib.suppress(OSError, ValueError):
            found[meta.parent] = json.loads(meta.read_text())
    return found


def complete_snapshots(
    root: Path, kit_version: str, vmm_version: str
) -> dict[Path, dict[str, Any]]:
    """The finished snapshots of one kit and VMM under `root`, with their `meta.json`."""
    return {
        path: meta
        for path, meta in _finished(root).items()
        if (meta.get("kit"), meta.get("vmm")) == (kit_version, vmm_version)
    }


def sandbox_vm(
    kit: Kit, name: str, shape: Shape, disk: Path, workdir: Path, kernel_args: str, netns: str
) -> VmSpec:
    """A sandbox's VM, or the snapshot VM: restoring needs the very same devices in both."""
    return VmSpec(
        name=name,
        vcpus=shape.vcpus,
        memory_mb=shape.memory_mb,
        kernel=kit.kernel,
        initrd=kit.initrd,
        disks=(DiskSpec(kit.runtime_disk, "raw", read_only=True), DiskSpec(disk, "qcow2")),
        workdir=workdir,
        kernel_args=kernel_args,
        netns=netns,
        tap=TAP_NAME,
        guest_files=((init_secret.FW_CFG_NAME, workdir / INIT_SECRET_FILE),),
    )


def write_init_secret(workdir: Path) -> str:
    """A new secret for the VM of `workdir`, readable by root alone."""
    secret = init_secret.new_secret()
    path = workdir / INIT_SECRET_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(secret)
    return secret


def read_init_secret(workdir: Path) -> str | None:
    try:
        return (workdir / INIT_SECRET_FILE).read_text().strip() or None
    except OSError:
        return None


class BootSnapshots:
    """Snapshots under `root`, one directory per key: `memory`, `vmstate`, `meta.json`."""

    def __init__(
        self,
        root: Path,
        kit: Kit,
        driver: VmmDriver,
        kernel_args: str,
        accel: str,
        boot_timeout: float,
    ) -> None:
        self.root = root
        self.kit = kit
        self.driver = driver
        self.kernel_args = kernel_args
        self.accel = accel
        self.boot_timeout = boot_timeout
        self._builds: dict[str, asyncio.Task[None]] = {}

    def key(self, shape: Shape) -> str:
        doc = [FORMAT, self.kit.version, self.driver.version, self.accel, shape.vcpus]
        doc.append(shape.memory_mb)
        doc += [self.kernel_args, DISK_BYTES]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:24]

    def ready(self, shape: Shape) -> Path | None:
        """The snapshot directory for `shape`, if one is complete."""
        path = self.root / self.key(shape)
        return path if (path / "meta.json").exists() else None

    def request(self, shape: Shape) -> None:
        """Build the snapshot for `shape` in the background unless it exists or is building."""
        key = self.key(shape)
        if key in self._builds or self.ready(shape):
            return
        task = asyncio.create_task(self._build(shape, key))
        self._builds[key] = task
        task.add_done_callback(lambda _: self._builds.pop(key, None))

    def discard(self, shape: Shape) -> None:
        """Drop a snapshot that failed to restore; the next request builds it again."""
        path = self.root / self.key(shape)
        with contextlib.suppress(FileNotFoundError):
            (path / "meta.json").unlink()
        shutil.rmtree(path, ignore_errors=True)

    async def wait(self) -> None:
        """Wait for the builds in progress (tests and benchmarks)."""
        while self._builds:
            await asyncio.gather(*self._builds.values(), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._builds.values()):
            task.cancel()
        await asyncio.gather(*self._builds.values(), return_exceptions=True)

    async def _build(self, shape: Shape, key: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        lock = await asyncio.to_thread(_try_lock, self.root / f"{key}.lock")
        if lock is None:
            return  # another server on this host is building it
        try:
            if self.ready(shape):
                return
            work = self.root / f"{key}.building"
            # Holding the lock, anything left in `work` is from a server that died building.
            for workdir, pid in self.driver.running_vms(self.root).items():
                if workdir == work:
                    await self.driver.kill_pid(pid)
            await destroy_network(_netns(key))
            shutil.rmtree(work, ignore_errors=True)
            try:
                await self._boot_and_save(shape, key, work)
                work.rename(self.root / key)
                self._prune(keep=key)
                log.info("boot snapshot %s ready (%s)", key, shape)
            except Exception as exc:
                log.warning("boot snapshot %s failed: %s", key, exc)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        finally:
            os.close(lock)

    async def _boot_and_save(self, shape: Shape, key: str, work: Path) -> None:
        work.mkdir(parents=True)
        placeholder = work / "placeholder.qcow2"
        await create_qcow2(placeholder, DISK_BYTES)
        # Never used: each restored sandbox's VMM brings its own secret of the same length.
        write_init_secret(work)
        # The snapshot VM's tap sits in a namespace of its own, connected to nothing.
        netns = _netns(key)
        name = f"aenv-bootsnap-{key[:12]}"
        spec = sandbox_vm(self.kit, name, shape, placeholder, work, self.kernel_args, netns)
        await create_detached_tap(netns)
        try:
            await self._save(spec, work)
        finally:
            await destroy_network(netns)
        placeholder.unlink()
        meta: dict[str, Any]
        meta = {"key": key, "kit": self.kit.version, "kernel_args": self.kernel_args}
        meta |= {"vmm": self.driver.version}
        meta |= {"vcpus": shape.vcpus}
        meta |= {"memory_mb": shape.memory_mb, "disk_bytes": DISK_BYTES}
        (work / "meta.json").write_text(json.dumps(meta))

    async def _save(self, spec: VmSpec, work: Path) -> None:
        """Boot, wait for the agent to listen, and write the device state next to the RAM."""
        handle = await self.driver.boot(spec)
        try:
            console = work / "console.log"
            async with asyncio.timeout(self.boot_timeout):
                while AGENT_READY not in _read(console):
                    if not self.driver.is_alive(handle):
                        raise VmmError("the VM exited during boot")
                    await asyncio.sleep(0.1)
            await self.driver.pause(handle, work)
        finally:
            await self.driver.stop(handle)

    def _prune(self, keep: str) -> None:
        """Remove snapshots of other kits or kernel arguments: never restored again."""
        for path, meta in _finished(self.root).items():
            current = (meta.get("kit"), meta.get("kernel_args"), meta.get("vmm")) == (
                self.kit.version,
                self.kernel_args,
                self.driver.version,
            )
            if path.name != keep and not current:
                shutil.rmtree(path, ignore_errors=True)


def _netns(key: str) -> str:
    return f"aenvsnap-{key[:8]}"


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""
