"""Bringing a sandbox's VM up until its agent answers: restored from a snapshot, or booted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from ...config import SandboxConfig
from ...errors import Unavailable
from ...guest.client import AgentClient
from ...vmm import guestram
from ...vmm.driver import Launched, PreparedVm, VmHandle, VmmDriver, VmmError, VmSpec
from .bootsnap import BootSnapshots, Shape

log = logging.getLogger(__name__)

# A restored guest's agent answers within a second; far longer means the restore is bad.
RESTORE_TIMEOUT = 15.0


class VmLauncher:
    """Starts VMs with deadlines; on any failure the VM it started is stopped again."""

    def __init__(
        self, cfg: SandboxConfig, driver: VmmDriver, boot_snapshots: BootSnapshots | None
    ) -> None:
        self.cfg = cfg
        self.driver = driver
        self.boot_snapshots = boot_snapshots

    async def start(self, spec: VmSpec, agent: AgentClient, restorable: bool) -> VmHandle:
        """Restore from the boot snapshot of the VM's shape if there is one, else boot."""
        snapshots = self.boot_snapshots
        if snapshots is None or not restorable:
            return await self.boot(spec, agent)
        shape = Shape(spec.vcpus, spec.memory_mb)
        snapshot = snapshots.ready(shape)
        if snapshot is None:
            snapshots.request(shape)
            return await self.boot(spec, agent)
        try:
            return await self.restore(spec, agent, snapshot)
        except (VmmError, TimeoutError) as exc:
            log.warning("restore of %s failed, booting instead: %s", spec.name, exc)
            snapshots.discard(shape)
        return await self._boot_fresh(spec, agent)

    async def restore(
        self, spec: VmSpec, agent: AgentClient, saved: Path, launched: Launched | None = None
    ) -> VmHandle:
        """`spec` restored from the state in `saved`, its agent answering; raises VmmError or
        TimeoutError after stopping the VM again."""
        return await self.finish(await self.driver.prepare_restore(spec, saved), agent, launched)

    async def finish(
        self, prepared: PreparedVm, agent: AgentClient, launched: Launched | None = None
    ) -> VmHandle:
        """A prepared VM's saved state loaded and its agent answering; raises VmmError or
        TimeoutError after stopping the VM again."""
        handle = await self.driver.finish_restore(prepared, launched)
        try:
            await self._await_agent(handle, agent, RESTORE_TIMEOUT, poll=0.02)
        except BaseException:
            await self.driver.stop(handle)
            raise
        return handle

    async def boot(self, spec: VmSpec, agent: AgentClient) -> VmHandle:
        """Boot with a deadline; retry, since TCG guests occasionally stall early."""
        attempts = max(1, self.cfg.boot_attempts)
        problem = ""
        for attempt in range(1, attempts + 1):
            handle = await self.driver.boot(spec)
            try:
                await self._await_agent(handle, agent, self.cfg.boot_timeout, poll=0.1)
                return handle
            except (TimeoutError, VmmError) as exc:
                problem = str(exc) or f"no answer within {self.cfg.boot_timeout:.0f}s"
                tail = _tail(handle.console_log)
                log.warning(
                    "boot attempt %d of %s failed: %s\n%s", attempt, spec.name, problem, tail
                )
                await self.driver.stop(handle)
                handle.console_log.rename(handle.console_log.with_suffix(f".{attempt}.log"))
            except BaseException:
                await self.driver.stop(handle)
                raise
        raise Unavailable(f"sandbox did not boot after {attempts} attempts: {problem}")

    async def _await_agent(
        self, handle: VmHandle, agent: AgentClient, timeout: float, poll: float
    ) -> None:
        """Until the agent answers; TimeoutError after `timeout`, VmmError if the VMM exits.
        A connected poll waits for its answer: on a loaded host a restored guest may take
        seconds to answer its first, and polls dropped sooner would never be answered."""
        async with asyncio.timeout(timeout):
            while not await agent.healthy(answer_within=timeout):
                if not self.driver.is_alive(handle):
                    raise VmmError("the VM exited before its agent answered")
                await asyncio.sleep(poll)

    async def _boot_fresh(self, spec: VmSpec, agent: AgentClient) -> VmHandle:
        """Boot after a failed restore, without its RAM and with its console kept aside."""
        guestram.drop(spec.workdir)
        with contextlib.suppress(FileNotFoundError):
            (spec.workdir / "console.log").rename(spec.workdir / "console.restore.log")
        return await self.boot(spec, agent)


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""
