"""A sandbox-shaped VM driven by the QEMU driver alone: the floor under our API's paths.

It runs in a namespace of its own with a tap like a sandbox's, and a probe inside the
namespace, started before the VM, times the moment the guest's agent answers `/health`
(no API, overlay setup, NAT, `/init` or proxy on the way).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

from agentenv.config import load_config
from agentenv.guest.client import AgentClient
from agentenv.guest.kit import load_kit
from agentenv.images.buildscripts import DEFAULT_USER
from agentenv.net.netns import TAP_NAME, create_detached_tap, destroy_network
from agentenv.net.nslistener import enter_namespace
from agentenv.runtime.machine.bootsnap import DISK_BYTES, Shape, sandbox_vm, write_init_secret
from agentenv.runtime.sandboxes.machines import guest_kernel_args
from agentenv.runtime.snapshots.checkpoint import DISK
from agentenv.vmm.driver import VmHandle
from agentenv.vmm.qemu import QemuDriver
from agentenv.vmm.qemuimg import copy_sparse, create_qcow2
from agentenv.wire import ENVD_PORT

# Connects every few ms until the guest takes the connection, then waits for its answer:
# dropped sooner, a guest starved of CPU among dozens never gets one answered.
_HEALTH_PROBE = """
import socket, sys, time
while True:
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.05) as conn:
            conn.settimeout(float(sys.argv[3]))
            conn.sendall(b"GET /health HTTP/1.0\\r\\n\\r\\n")
            if b" 204 " in conn.recv(64):
                break
    except OSError:
        time.sleep(0.005)
print(time.monotonic())
"""


# Seconds a restore may take until its agent answers.
RESTORE_TIMEOUT = 120


class RawGuest:
    """`async with RawGuest(workdir) as guest`: restore, pause and restore again, timed."""

    def __init__(self, workdir: Path, memory_mb: int = 256, name: str = "") -> None:
        """`name` tells apart guests of one process (their namespaces and VMs)."""
        self.cfg = load_config()
        kit = load_kit(self.cfg)
        assert kit is not None, "build the kit first"
        self.netns = f"aenvbench-{os.getpid()}{name}"
        self.disk = workdir / "disk.qcow2"
        self.snapshot_dir = workdir / "snapshot"
        vm_name = f"aenv-bench-{os.getpid()}{name}"
        args = guest_kernel_args(self.cfg)
        shape = Shape(1, memory_mb)
        self.spec = sandbox_vm(kit, vm_name, shape, self.disk, workdir, args, self.netns)
        self.driver = QemuDriver(self.cfg.vmm.qemu_binary, "tcg", nice=self.cfg.vmm.guest_nice)
        self.handle: VmHandle | None = None

    async def __aenter__(self) -> RawGuest:
        await create_detached_tap(self.netns)
        net = self.cfg.net
        # Re-ask for the guest's MAC every 10 ms, so the probe sees the guest the moment it
        # answers (the default retry is a second).
        for argv in (
            ("ip", "-n", self.netns, "addr", "add", f"{net.guest_gateway}/{net.guest_prefix}",
             "dev", TAP_NAME),
            ("ip", "netns", "exec", self.netns, "sysctl", "-qw",
             f"net.ipv4.neigh.{TAP_NAME}.retrans_time_ms=10"),
        ):  # fmt: skip
            await (await asyncio.create_subprocess_exec(*argv)).wait()
        await create_qcow2(self.disk, DISK_BYTES)
        write_init_secret(self.spec.workdir)  # the VM hands it to the guest, as a sandbox's
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.handle is not None:
            await self.driver.stop(self.handle)
        await destroy_network(self.netns)

    async def restore_with_disk(self, snapshot: Path) -> float:
        """`restore` of a sandbox's snapshot: its disk copied into place first, as a create
        from it copies it."""
        await asyncio.to_thread(copy_sparse, snapshot / DISK, self.disk)
        return await self.restore(snapshot)

    async def restore(self, snapshot: Path) -> float:
        """Seconds from the restore call until the agent answers."""
        probe = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", self.netns, sys.executable, "-c", _HEALTH_PROBE,
            self.cfg.net.guest_ip, str(ENVD_PORT), str(RESTORE_TIMEOUT),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        start = time.monotonic()
        try:
            self.handle = await self.driver.restore(self.spec, snapshot)
            # Long: dozens of guests restored at once under TCG share two cores.
            async with asyncio.timeout(RESTORE_TIMEOUT):
                out, _ = await probe.communicate()
        finally:
            if probe.returncode is None:  # the restore failed: the probe would poll forever
                probe.kill()
                await probe.wait()
        return float(out) - start

    async def work(
        self, access_token: str, commands: tuple[str, ...], path: str, data: bytes
    ) -> None:
        """What an episode asks of its guest, straight from its namespace to the agent:
        each command as the SDK runs it (`bash -l -c`, as `user`), then a file written."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def settle(error: BaseException | None) -> None:
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

        def run() -> None:
            # A thread of its own, with its own loop: it enters the namespace and ends (the
            # default pool's six threads would hold 32 workers' episodes to six at once).
            try:
                enter_namespace(self.netns)
                asyncio.run(self._work(access_token, commands, path, data))
            except BaseException as exc:
                loop.call_soon_threadsafe(settle, exc)
            else:
                loop.call_soon_threadsafe(settle, None)

        threading.Thread(target=run, name=f"work-in-{self.netns}", daemon=True).start()
        await done

    async def _work(
        self, access_token: str, commands: tuple[str, ...], path: str, data: bytes
    ) -> None:
        agent = AgentClient(f"http://{self.cfg.net.guest_ip}:{ENVD_PORT}", access_token, 60)
        for command in commands:
            code = await agent.run(["/bin/bash", "-l", "-c", command], user=DEFAULT_USER)
            if code != 0:
                raise RuntimeError(f"{command!r} exited {code} in a raw guest")
        await agent.write_file(path, data, user=DEFAULT_USER)

    async def stop(self) -> None:
        """Stop the VM (a restore's guest), ready to restore again."""
        if self.handle is not None:
            await self.driver.stop(self.handle)
            self.handle = None

    async def pause(self) -> float:
        """Seconds to save the device state and stop the VMM (what a pause does)."""
        assert self.handle is not None
        start = time.monotonic()
        await self.driver.pause(self.handle, self.snapshot_dir)
        await self.driver.stop(self.handle)
        self.handle = None
        return time.monotonic() - start
