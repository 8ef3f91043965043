"""QEMU `microvm` driver: one QEMU process per sandbox, controlled over QMP."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import os
import re
import shlex
import signal
import socket
import subprocess
from pathlib import Path

from ..crashpoints import crash_point
from . import guestram, kernelstub, migstream, privram, qemuballoon
from .driver import BalloonStats, Launched, PreparedVm, VmHandle, VmmError, VmSpec
from .qemucommand import FIRMWARE, RUN_DIR, build_command, host_tsc_khz, qmp_socket
from .qemuimg import create_qcow2
from .qmp import QmpClient


def run_dir_for(home: Path) -> Path:
    """One directory per server home, so a server only ever sweeps its own sockets."""
    return RUN_DIR / hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]


_STOP_GRACE_S = 2.0
_TERM_GRACE_S = 5.0
# Device state is tens of KB (RAM is not in the stream), so this is generous.
_MIGRATE_DEADLINE_S = 60.0
# A VM's saved device state; renamed once a guest restored in place has run from it.
VMSTATE = "vmstate"
CONSUMED_VMSTATE = "vmstate.consumed"
# In the work directory of a VM that maps a snapshot's RAM: the head of that snapshot's
# saved state, which its own device state is spliced onto when it pauses.
STREAM_HEAD = "vmstate.head"
# A VMM's log is cut back to its first part (startup errors) once it outgrows the limit.
LOG_LIMIT = 1024 * 1024
_LOG_KEPT = 64 * 1024
# Device sections alone, as `xen-save-devices-state` writes them, until spliced.
_DEVICE_STATE = "devices.partial"
# QEMU opens a RAM file read-only for a writable private mapping (`readonly=on,rom=off`)
# from 8.2 on; before, a balloon discard punched holes into the file under every clone.
_PRIVATE_RAM_SINCE = (8, 2)


def qemu_version_name(binary: str) -> str:
    """What a driver for `binary` calls its version, e.g. "qemu 10.0.2 qboot.rom"; a saved
    guest restores only into the same QEMU and firmware."""
    return _version_name(qemu_version(binary))


def _version_name(numbers: tuple[int, ...]) -> str:
    return "qemu " + ".".join(map(str, numbers)) + " " + FIRMWARE


def qemu_version(binary: str) -> tuple[int, ...]:
    """`qemu-system-x86_64 --version` as numbers, e.g. (10, 0, 2); () if it cannot tell."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    match = re.search(r"version (\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(part) for part in match.groups()) if match else ()


async def _wait_status_leaves(client: QmpClient, status: str, deadline: float) -> str:
    try:
        async with asyncio.timeout(deadline):
            while True:
                current = (await client.execute("query-status"))["status"]
                if current != status:
                    return current
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise VmmError(f"VM still {status} after {deadline:.0f}s") from None


async def _ignore_shared_ram(client: QmpClient) -> None:
    # RAM lives in the shared memory file: migration streams carry device state only.
    await client.execute(
        "migrate-set-capabilities",
        {"capabilities": [{"capability": "x-ignore-shared", "state": True}]},
    )


def trim_log(path: Path) -> None:
    """Cut `path` back to its first part once it is over LOG_LIMIT. QEMU appends
    (`O_APPEND`), so what it writes next lands after the cut."""
    try:
        if path.stat().st_size <= LOG_LIMIT:
            return
        os.truncate(path, _LOG_KEPT)
        with open(path, "ab") as log:
            log.write(b"\n[aenv: log over its limit; cut here]\n")
    except OSError:
        pass


def _log_tail(workdir: Path) -> str:
    try:
        return (workdir / "vmm.log").read_text(errors="replace")[-2000:].strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class QemuDriver:
    """Runs QEMU processes that outlive the server; a restarted server re-adopts them."""

    name = "qemu"

    def __init__(
        self,
        qemu_binary: str,
        accel: str,
        run_dir: Path = RUN_DIR,
        *,
        merge_pages: bool = False,
        translation_buffer_mb: int = 64,
        nice: int = 0,
    ) -> None:
        self.qemu_binary = qemu_binary
        self.accel = accel
        self.run_dir = run_dir
        self.merge_pages = merge_pages
        self.translation_buffer_mb = translation_buffer_mb
        self.nice = nice
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self._tsc_khz = host_tsc_khz()
        numbers = qemu_version(qemu_binary)
        self.version = _version_name(numbers)
        self.shares_snapshot_ram = numbers >= _PRIVATE_RAM_SINCE
        self._privram = privram.build(run_dir) if self.shares_snapshot_ram else None
        # Each kernel's header-only stub for restores, made once (restores are a hot path).
        self._restore_kernels: dict[Path, Path] = {}

    async def create_disk(
        self, path: Path, size: int | None, backing: Path | None, backing_format: str
    ) -> None:
        await create_qcow2(path, size, backing=backing, backing_format=backing_format)

    async def boot(self, spec: VmSpec) -> VmHandle:
        return await self._launch(spec, incoming=False)

    async def restore(
        self, spec: VmSpec, snapshot_dir: Path, launched: Launched | None = None
    ) -> VmHandle:
        return await self.finish_restore(await self.prepare_restore(spec, snapshot_dir), launched)

    async def prepare_restore(self, spec: VmSpec, snapshot_dir: Path) -> PreparedVm:
        workdir = spec.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        # A clone starts from the snapshot's RAM (a whole file, or a base and a delta); a
        # paused VM has none there: its RAM is in its work directory still.
        in_place = not guestram.holds_ram(snapshot_dir, snapshot_dir)
        try:
            if in_place:
                base = workdir / guestram.BASE if guestram.maps_base(workdir) else None
                delta = base is not None
            else:
                base, delta = await asyncio.to_thread(
                    self._take_snapshot_ram, snapshot_dir, workdir
                )
            if base is not None:
                # Its next pause splices its device state onto this stream's head.
                head = migstream.head((snapshot_dir / VMSTATE).read_bytes())
                (workdir / STREAM_HEAD).write_bytes(head)
        except (OSError, migstream.StreamError) as exc:
            raise VmmError(f"taking the saved memory failed: {exc}") from exc
        handle = await self._launch(spec, incoming=True, ram_base=base)
        pages = snapshot_dir / guestram.DELTA if base is not None and delta else None
        return PreparedVm(handle, snapshot_dir, in_place, pages)

    async def finish_restore(
        self, prepared: PreparedVm, launched: Launched | None = None
    ) -> VmHandle:
        handle, snapshot_dir, in_place = prepared.handle, prepared.snapshot_dir, prepared.in_place
        try:
            if launched is not None:
                await launched(handle)
            if prepared.pages is not None:
                base = Path(handle.extra["ram_base"])
                try:
                    await asyncio.to_thread(guestram.load_delta, handle.pid, base, prepared.pages)
                except OSError as exc:
                    raise VmmError(f"writing the guest's saved pages back failed: {exc}") from exc
            client = await QmpClient.connect(Path(handle.extra["qmp"]))
            try:
                await _ignore_shared_ram(client)
                await client.execute(
                    "migrate-incoming",
                    {"uri": f"exec:cat {shlex.quote(str(snapshot_dir / VMSTATE))}"},
                )
                status = await _wait_status_leaves(client, "inmigrate", _MIGRATE_DEADLINE_S)
                if status not in ("paused", "running"):
                    raise VmmError(f"loading the snapshot's device state failed: {status}")
                await self._continue_restored(client, snapshot_dir, in_place)
            finally:
                await client.close()
        except VmmError as exc:
            await self.stop(handle)
            raise VmmError(f"{exc}; log: {_log_tail(Path(handle.workdir))}") from exc
        except BaseException:
            await self.stop(handle)
            raise
        return handle

    def _take_snapshot_ram(self, snapshot_dir: Path, workdir: Path) -> tuple[Path | None, bool]:
        """Map the snapshot's RAM file (or the base under its delta) where QEMU can: its
        pages stay shared; else make the clone a whole copy of its own. Returns the base
        to map, if any, and whether the snapshot's delta goes over it."""
        guestram.drop(workdir)
        whole = (snapshot_dir / guestram.OWN).exists()
        source = snapshot_dir / (guestram.OWN if whole else guestram.BASE)
        if self.shares_snapshot_ram and guestram.link_base(source, workdir):
            return workdir / guestram.BASE, not whole
        guestram.copy_whole(snapshot_dir, snapshot_dir, workdir / guestram.OWN)
        return None, False

    async def _continue_restored(
        self, client: QmpClient, snapshot_dir: Path, in_place: bool
    ) -> None:
        """`cont`; restoring in place consumes the saved state first, since once the guest
        runs it writes the very RAM file the state was saved with."""
        if not in_place:
            await client.execute("cont")
            return
        saved = snapshot_dir / VMSTATE
        consumed = snapshot_dir / CONSUMED_VMSTATE
        saved.rename(consumed)
        crash_point("resume.consumed")
        try:
            await client.execute("cont")
        except VmmError as exc:
            if "no answer" not in str(exc):
                consumed.rename(saved)  # refused: the guest never ran
            raise

    def saved_state_intact(self, snapshot_dir: Path) -> bool:
        return (snapshot_dir / VMSTATE).is_file()

    async def _launch(
        self, spec: VmSpec, *, incoming: bool, ram_base: Path | None = None
    ) -> VmHandle:
        spec.workdir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        control = qmp_socket(spec.name, self.run_dir)
        control.unlink(missing_ok=True)
        if incoming:
            stub = self._restore_kernels.get(spec.kernel)
            if stub is None:
                stub = await asyncio.to_thread(kernelstub.header_only, spec.kernel, self.run_dir)
                self._restore_kernels[spec.kernel] = stub
            spec = dataclasses.replace(spec, kernel=stub)
        command = build_command(
            self.qemu_binary,
            self.accel,
            spec,
            self._tsc_khz,
            self.run_dir,
            incoming=incoming,
            ram_base=ram_base,
            base_discards=ram_base is not None and self._privram is not None,
            merge_pages=self.merge_pages,
            translation_buffer_mb=self.translation_buffer_mb,
            nice=self.nice,
        )
        env = None
        if ram_base is not None and self._privram is not None:
            env = privram.environment(self._privram, ram_base)
        if spec.netns:
            command = ["nsenter", f"--net=/run/netns/{spec.netns}", "--", *command]
        with open(spec.workdir / "vmm.log", "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                *command,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                # Own session: the VM survives a server restart or a Ctrl-C to the server.
                start_new_session=True,
            )
        self._children[proc.pid] = proc
        handle = VmHandle(
            driver=self.name,
            pid=proc.pid,
            workdir=str(spec.workdir),
            accel=self.accel,
            extra={"qmp": str(control)},
        )
        if ram_base is not None:
            handle.extra["ram_base"] = str(ram_base)
        try:
            client = await QmpClient.connect(Path(handle.extra["qmp"]), timeout=10.0)
            await client.close()
        except VmmError as exc:
            await self.stop(handle)
            raise VmmError(f"QEMU did not start: {exc}; log: {_log_tail(spec.workdir)}") from exc
        if env is not None and ram_base is not None:
            # Its RAM is mapped by now: a QEMU that holds the file writable (the library
            # did not load) would punch holes into it under every clone. Never let it run.
            if not await asyncio.to_thread(privram.held_read_only, proc.pid, ram_base):
                await self.stop(handle)
                raise VmmError(f"QEMU holds {ram_base} writable: {privram.SOURCE.name} not loaded")
        return handle

    def is_alive(self, handle: VmHandle) -> bool:
        # The workdir appears in the command line, so a reused pid is never mistaken for ours.
        return handle.workdir.encode() in _cmdline(handle.pid)

    def running_vms(self, root: Path) -> dict[Path, int]:
        found: dict[Path, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            argv = _cmdline(int(entry.name)).split(b"\0")
            if not argv or not argv[0].endswith(b"qemu-system-x86_64"):
                continue
            for arg in argv:
                if arg.startswith(b"file:") and arg.endswith(b"/console.log"):
                    workdir = Path(arg[len(b"file:") : -len(b"/console.log")].decode())
                    if workdir.parent == root:
                        found[workdir] = int(entry.name)
        return found

    def reclaim_control_files(self) -> int:
        """Remove control sockets no VMM listens on any more; returns how many."""
        removed = 0
        for path in self.run_dir.glob("*.qmp") if self.run_dir.is_dir() else ():
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(str(path))
                    continue
                except ConnectionRefusedError:
                    pass
                except OSError:
                    continue
            path.unlink(missing_ok=True)
            removed += 1
        return removed

    async def kill_pid(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    async def _qmp(self, handle: VmHandle, command: str, arguments: dict | None = None) -> object:
        client = await QmpClient.connect(Path(handle.extra["qmp"]))
        try:
            return await client.execute(command, arguments)
        finally:
            await client.close()

    async def stop(self, handle: VmHandle) -> None:
        if self.is_alive(handle):
            with contextlib.suppress(VmmError, OSError, TimeoutError):
                async with asyncio.timeout(_STOP_GRACE_S):
                    await self._qmp(handle, "quit")
            await self._wait_gone(handle, 0.5)
        await self._signal_out(handle, (signal.SIGTERM, _TERM_GRACE_S), (signal.SIGKILL, 2.0))

    async def discard(self, handle: VmHandle) -> None:
        await self._signal_out(handle, (signal.SIGKILL, 2.0))

    async def _signal_out(self, handle: VmHandle, *steps: tuple[signal.Signals, float]) -> None:
        """Signal QEMU, each signal given its grace in turn, until it is gone; reap it."""
        for sig, grace in steps:
            if not self.is_alive(handle):
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, sig)
            if await self._wait_gone(handle, grace):
                break
        else:
            raise VmmError(f"QEMU pid {handle.pid} survived SIGKILL")
        child = self._children.pop(handle.pid, None)
        if child is not None:
            await child.wait()
        if "qmp" in handle.extra:  # a handle another node's VM left has no socket here
            Path(handle.extra["qmp"]).unlink(missing_ok=True)

    async def _wait_gone(self, handle: VmHandle, timeout: float) -> bool:
        # A zombie has an empty command line, so this is False as soon as QEMU exits.
        deadline = asyncio.get_running_loop().time() + timeout
        while self.is_alive(handle):
            if asyncio.get_running_loop().time() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def pause(self, handle: VmHandle, snapshot_dir: Path) -> None:
        snapshot_dir.mkdir(parents=True, exist_ok=True)
        state = snapshot_dir / VMSTATE
        partial = snapshot_dir / f"{VMSTATE}.partial"
        # Whatever was saved before is stale the moment this guest is frozen anew.
        state.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
        client = await QmpClient.connect(Path(handle.extra["qmp"]))
        try:
            await client.execute("stop")
            if "ram_base" in handle.extra:
                await self._save_private(client, handle, snapshot_dir)
                return
            await _ignore_shared_ram(client)
            # The state gets its name only once it is whole: a crash never leaves a torn one.
            target = f"cat > {shlex.quote(str(partial))} && mv -f {shlex.quote(str(partial))} "
            target += shlex.quote(str(state))
            await client.execute("migrate", {"uri": f"exec:{target}"})
            async with asyncio.timeout(_MIGRATE_DEADLINE_S):
                while True:
                    status = (await client.execute("query-migrate")).get("status")
                    if status == "completed":
                        break
                    if status in ("failed", "cancelled"):
                        raise VmmError(f"saving device state failed: {status}")
                    await asyncio.sleep(0.002)
                # QEMU is done writing; the shell renames once `cat` has all of it.
                while True:
                    if state.exists():
                        break
                    await asyncio.sleep(0.002)
        except TimeoutError:
            raise VmmError(f"saving device state: not done in {_MIGRATE_DEADLINE_S:.0f}s") from None
        finally:
            await client.close()

    async def _save_private(self, client: QmpClient, handle: VmHandle, snapshot_dir: Path) -> None:
        """Save a stopped VM that maps a snapshot's RAM: the pages it wrote, and its device
        sections spliced onto the snapshot's stream head (`migrate` would send all RAM)."""
        devices = snapshot_dir / _DEVICE_STATE
        await client.execute("xen-save-devices-state", {"filename": str(devices), "live": False})
        try:
            await asyncio.to_thread(self._write_private_state, handle, snapshot_dir, devices)
        except (OSError, migstream.StreamError) as exc:
            raise VmmError(f"saving the guest's memory failed: {exc}") from exc
        finally:
            devices.unlink(missing_ok=True)

    @staticmethod
    def _write_private_state(handle: VmHandle, snapshot_dir: Path, devices: Path) -> None:
        workdir = Path(handle.workdir)
        delta = snapshot_dir / guestram.DELTA
        partial = delta.with_name(delta.name + ".partial")
        guestram.save_delta(handle.pid, Path(handle.extra["ram_base"]), partial)
        partial.rename(delta)
        stream = migstream.splice((workdir / STREAM_HEAD).read_bytes(), devices.read_bytes())
        state = snapshot_dir / VMSTATE
        partial = state.with_name(state.name + ".partial")
        partial.write_bytes(stream)
        # Named last: a whole state is one whose delta is in place. Neither is synced to
        # disk, like a VM's own RAM file: a pause outlives a crash of any process, and a
        # power loss ends the guests anyway.
        partial.rename(state)

    async def freeze(self, handle: VmHandle) -> None:
        # `stop` returns once the vCPUs are stopped and in-flight block requests drained.
        await self._qmp(handle, "stop")

    async def resume(self, handle: VmHandle) -> None:
        await self._qmp(handle, "cont")

    def trim_log(self, handle: VmHandle) -> None:
        trim_log(Path(handle.workdir) / "vmm.log")

    @property
    def returns_free_pages(self) -> bool:
        # A VM's own RAM file always can; a clone's mapping of a snapshot with `privram`.
        return self._privram is not None or not self.shares_snapshot_ram

    async def set_balloon(self, handle: VmHandle, target_mb: int) -> None:
        await self._qmp(handle, "balloon", {"value": target_mb * qemuballoon.MIB})

    async def balloon(self, handle: VmHandle) -> BalloonStats:
        client = await QmpClient.connect(Path(handle.extra["qmp"]))
        try:
            return await qemuballoon.read(client)
        finally:
            await client.close()
