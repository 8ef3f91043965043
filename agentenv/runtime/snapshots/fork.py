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

from ...crashpoints import crash_point
from ...observe.metrics import timed
from ...state.lifecycle import Event
from ...state.sandboxes import SandboxOptions, SandboxRecord
from ..machine.bootsnap import Shape
from ..sandboxes.manager import SandboxManager
from .checkpoint import provision_from_checkpoint, take_checkpoint

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
        with timed("fork"):
            checkpoint = self.manager.machines.forks_dir() / secrets.token_hex(8)

            async def freeze_and_copy(record: SandboxRecord) -> SandboxRecord:
                await take_checkpoint(self.manager, record, checkpoint, memory=True)
                return record

            source = await self.manager.operate(sandbox_id, Event.CHECKPOINT, freeze_and_copy)
            try:
                if timeout is None:
                    timeout = self.manager.cfg.sandbox.default_timeout
                wanted = self.manager.intake.clamp_timeout(timeout)
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

    async def _fork_one(
        self, source: SandboxRecord, checkpoint: Path, timeout: int
    ) -> SandboxRecord:
        record = await self.manager.intake.new_record(
            template_id=source.template_id,
            alias=source.alias,
            timeout=timeout,
            shape=Shape(source.vcpus, source.memory_mb),
            guest=source.guest,
            options=SandboxOptions.of(source),
        )
        kit = self.manager.machines.pinned_kit(source)
        return await self.manager.bring_up(
            record,
            lambda cleanup: provision_from_checkpoint(
                self.manager, record, checkpoint, kit, cleanup
            ),
        )
