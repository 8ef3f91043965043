"""Fork: checkpoint a running sandbox in place and start sandboxes from that checkpoint.

The source freezes only for the copies (state `checkpointing`); each fork is created like
a sandbox but restored from the checkpoint's RAM and device state, with a copy of its disk.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import shutil
from pathlib import Path

from ..control.store import SandboxRecord
from ..crashpoints import crash_point
from ..errors import Unavailable
from ..vmm.driver import VmHandle, VmmError
from ..vmm.qemuimg import copy_sparse
from .cleanup import CleanupStack
from .lifecycle import Event
from .manager import SandboxManager

log = logging.getLogger(__name__)


class SandboxForks:
    """`fork` for the sandboxes of one manager."""

    def __init__(self, manager: SandboxManager) -> None:
        self.manager = manager

    async def fork(
        self, sandbox_id: str, count: int, timeout: int | None
    ) -> list[SandboxRecord | Exception]:
        """Checkpoint a running sandbox in place (it keeps its id and expiry) and start
        `count` sandboxes from that one checkpoint; each fork succeeds or fails alone."""
        checkpoint = self.manager.forks_dir() / secrets.token_hex(8)
        source = await self.manager.operate(
            sandbox_id, Event.CHECKPOINT, lambda record: self._checkpoint(record, checkpoint)
        )
        try:
            if timeout is None:
                timeout = self.manager.cfg.sandbox.default_timeout
            wanted = self.manager.clamp_timeout(timeout)
            forks = (self._fork_one(source, checkpoint, wanted) for _ in range(count))
            results = await asyncio.gather(*forks, return_exceptions=True)
            crash_point("fork.children")
        finally:
            await asyncio.to_thread(shutil.rmtree, checkpoint, True)
        outcomes: list[SandboxRecord | Exception] = []
        for result in results:
            if not isinstance(result, (SandboxRecord, Exception)):
                raise result  # a cancellation, not one fork's failure
            outcomes.append(result)
        started = sum(isinstance(r, SandboxRecord) for r in outcomes)
        log.info("sandbox %s forked into %d of %d", sandbox_id, started, count)
        return outcomes

    async def _checkpoint(self, source: SandboxRecord, checkpoint: Path) -> SandboxRecord:
        """Device state, RAM and disk of `source` at one instant; it runs on afterwards."""
        crash_point("fork.begun")
        assert source.vm is not None
        handle = VmHandle.from_dict(source.vm)
        workdir = self.manager.workdir(source.sandbox_id)
        checkpoint.mkdir(parents=True)
        try:
            await self.manager.driver.pause(handle, checkpoint)
            crash_point("fork.frozen")
            for name in ("memory", "rootfs.qcow2"):
                await asyncio.to_thread(copy_sparse, workdir / name, checkpoint / name)
            crash_point("fork.copied")
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, checkpoint, True)
            raise
        finally:
            await self.manager.driver.resume(handle)
        return source

    async def _fork_one(
        self, source: SandboxRecord, checkpoint: Path, timeout: int
    ) -> SandboxRecord:
        record = await self.manager.new_record(
            template_id=source.template_id,
            alias=source.alias,
            timeout=timeout,
            vcpus=source.vcpus,
            memory_mb=source.memory_mb,
            metadata=dict(source.metadata),
            env_vars=dict(source.env_vars),
            auto_pause=source.auto_pause,
            allow_internet=source.allow_internet,
            secure=source.access_token is not None,
        )
        kit = self.manager.pinned_kit(source)

        async def provision(cleanup: CleanupStack) -> None:
            workdir = self.manager.make_workdir(record, cleanup)
            await asyncio.to_thread(
                copy_sparse, checkpoint / "rootfs.qcow2", workdir / "rootfs.qcow2"
            )
            await self.manager.make_network(record, cleanup)
            agent = self.manager.agent(record)
            try:
                handle = await self.manager.launcher.restore(
                    self.manager.vm_spec(record, kit), agent, checkpoint
                )
            except (VmmError, TimeoutError) as exc:
                raise Unavailable(f"fork could not start: {exc}") from exc
            cleanup.push("vm", lambda: self.manager.driver.stop(handle))
            await self.manager.save_vm(record, handle, kit)
            # A new clock reading, entropy of its own, and its own access token.
            await agent.init({}, record.access_token)

        return await self.manager.bring_up(record, provision)
