"""A node's memory: what each running sandbox holds on the host (its VMM's proportional
set size, PSS, which splits pages clones share between them) and what its guest reports,
sampled in the background; sandboxes whose idle-pause policy came due pause; and what the
node does when the host runs short. Idle guests give memory back first
(`guest/agent/reclaim.py`), then the longest-idle sandboxes pause to the snapshot store.
A running guest is never killed for memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from ...config import SandboxConfig
from ...errors import AenvError, Conflict, InvalidInput, Unavailable
from ...observe.metrics import MEMORY_RELIEF, SANDBOX_MEMORY
from ...state.sandboxes import SandboxRecord
from ...vmm.driver import BalloonStats, VmHandle, VmmError
from ..memory.admission import available_memory_mb
from ..sandboxes.manager import SandboxManager

log = logging.getLogger(__name__)

T = TypeVar("T")

MIB = 1024 * 1024
# The smallest balloon target: below it a guest's kernel and agent do not fit.
MIN_BALLOON_MB = 128
# A sandbox that does not answer within this is sampled next time.
_SAMPLE_TIMEOUT_S = 5.0
# What a guest frees reaches the host a few seconds later (free page reporting waits 2 s).
_SETTLE_S = 5.0


@dataclass(frozen=True)
class Footprint:
    """What a VMM process holds in host memory, in bytes."""

    pss: int
    anonymous: int


def footprint(pid: int, proc: Path = Path("/proc")) -> Footprint | None:
    """From `smaps_rollup`; None when the process is gone."""
    figures: dict[str, int] = {}
    try:
        lines = (proc / str(pid) / "smaps_rollup").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        name, value, *_ = line.split()
        figures[name.rstrip(":")] = int(value) * 1024
    return Footprint(figures.get("Pss", 0), figures.get("Anonymous", 0))


@dataclass(frozen=True)
class SandboxMemory:
    """One sample of a running sandbox: its record as listed, what it holds on the host,
    what its guest says it uses (bytes) and how long it idled (None: no answer)."""

    record: SandboxRecord
    host: Footprint
    guest_used: int | None
    idle_seconds: float | None


# Pauses a sandbox to relieve the host (the node's pause, which stores it when so set).
Pause = Callable[[str], Awaitable[None]]


class MemoryKeeper:
    """Samples every running sandbox and relieves memory pressure; one per node."""

    def __init__(
        self,
        manager: SandboxManager,
        pause: Pause,
        *,
        settle: float = _SETTLE_S,
        available: Callable[[], int] = available_memory_mb,
    ) -> None:
        self.manager = manager
        self.cfg: SandboxConfig = manager.cfg.sandbox
        self.pause = pause
        self.settle = settle
        # The host's available memory in MiB, as the kernel estimates it.
        self.available = available
        self.latest: dict[str, SandboxMemory] = {}

    async def run_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sample()
                await self.pause_idle()
                await self.relieve()
            except Exception:
                log.exception("memory sampling failed")

    async def sample(self) -> None:
        """Refresh `latest` for every running sandbox (and forget the others)."""
        # Routed exactly while running (the lifecycle sets routes).
        records = await self.manager.store.list()
        running = [r for r in records if r.vm and self.manager.routes.get(r.sandbox_id) is not None]
        samples = await asyncio.gather(*(self._sample(r) for r in running))
        self.latest = {r.sandbox_id: s for r, s in zip(running, samples, strict=True) if s}
        SANDBOX_MEMORY.clear()
        for sandbox_id, sample in self.latest.items():
            SANDBOX_MEMORY.labels(sandbox_id, "host_pss").set(sample.host.pss)
            if sample.guest_used is not None:
                SANDBOX_MEMORY.labels(sandbox_id, "guest_used").set(sample.guest_used)

    async def _sample(self, record: SandboxRecord) -> SandboxMemory | None:
        assert record.vm is not None  # sample() passes records with a VM only
        host = await asyncio.to_thread(footprint, VmHandle.from_dict(record.vm).pid)
        if host is None:
            return None
        try:
            async with asyncio.timeout(_SAMPLE_TIMEOUT_S):
                figures = await self.manager.machines.agent(record).metrics()
            self.manager.metrics_history.record(record.sandbox_id, figures)
            return SandboxMemory(
                record, host, int(figures["mem_used"]), float(figures["idle_seconds"])
            )
        except (httpx.HTTPError, TimeoutError, KeyError, ValueError):
            return SandboxMemory(record, host, None, None)

    async def set_balloon(self, sandbox_id: str, target_mb: int) -> None:
        """Leave a running sandbox's guest `target_mb` of its memory (all of it: deflate);
        what the balloon takes goes back to the host."""
        record = await self._running(sandbox_id)
        if not MIN_BALLOON_MB <= target_mb <= record.memory_mb:
            raise InvalidInput(
                f"balloon target {target_mb} MiB: give {MIN_BALLOON_MB} to "
                f"{record.memory_mb} MiB (the sandbox's memory)"
            )
        assert record.vm is not None  # _running checked it
        await self._vmm(self.manager.driver.set_balloon(VmHandle.from_dict(record.vm), target_mb))

    async def balloon(self, sandbox_id: str) -> BalloonStats:
        record = await self._running(sandbox_id)
        assert record.vm is not None  # _running checked it
        return await self._vmm(self.manager.driver.balloon(VmHandle.from_dict(record.vm)))

    async def _running(self, sandbox_id: str) -> SandboxRecord:
        record = await self.manager.get(sandbox_id)
        # Routed exactly while running (the lifecycle sets routes).
        if self.manager.routes.get(sandbox_id) is None or record.vm is None:
            raise Conflict(f"sandbox '{sandbox_id}' is not running")
        return record

    @staticmethod
    async def _vmm(call: Awaitable[T]) -> T:
        try:
            return await call
        except VmmError as exc:
            raise Unavailable(f"the sandbox's VMM did not answer: {exc}") from exc

    async def host_footprint(self, sandbox_id: str) -> Footprint | None:
        """What a running sandbox's VMM holds now; None unless it runs here."""
        record = await self.manager.get(sandbox_id)
        if record.vm is None or self.manager.routes.get(sandbox_id) is None:
            return None
        return await asyncio.to_thread(footprint, VmHandle.from_dict(record.vm).pid)

    def held_mb(self) -> int:
        """What running sandboxes hold on the host, by the last sample."""
        return sum(s.host.pss for s in self.latest.values()) // MIB

    async def pause_idle(self) -> None:
        """Pause the sandboxes whose idle-pause policy (`pause_after_idle`) has come due."""
        for sandbox_id, sample in list(self.latest.items()):
            due = sample.record.pause_after_idle
            if not due or sample.idle_seconds is None or sample.idle_seconds < due:
                continue
            try:
                await self.pause(sandbox_id)  # refused by the lifecycle unless running
            except AenvError as exc:
                log.warning("idle pause of %s failed: %s", sandbox_id, exc)
                continue
            log.info("sandbox %s paused after %.0f s idle", sandbox_id, sample.idle_seconds)

    async def relieve(self) -> None:
        """Below the reserve plus the margin, idle guests give memory back; still below
        the reserve, the longest-idle sandboxes pause, one at a time."""
        reserve = self.cfg.min_free_memory_mb
        if self.available() >= reserve + self.cfg.pressure_margin_mb:
            return
        idle = sorted(
            (s for s in self.latest.values() if s.idle_seconds),
            key=lambda s: s.idle_seconds or 0,
            reverse=True,
        )
        for sample in idle:
            sandbox_id = sample.record.sandbox_id
            if self.manager.routes.get(sandbox_id) is None:
                continue  # paused or gone since the sample
            with contextlib.suppress(TimeoutError, Unavailable):
                async with asyncio.timeout(_SAMPLE_TIMEOUT_S * 6):
                    freed = await self.manager.machines.agent(sample.record).reclaim()
                    MEMORY_RELIEF.labels("reclaim").inc()
                    log.info("memory pressure: %s gave back %d MiB", sandbox_id, freed >> 20)
        if not self.cfg.pause_under_pressure:
            return
        await asyncio.sleep(self.settle)
        for sample in idle:
            sandbox_id = sample.record.sandbox_id
            if self.available() >= reserve:
                return
            try:
                await self.pause(sandbox_id)
            except AenvError as exc:
                log.warning("memory pressure: pausing %s failed: %s", sandbox_id, exc)
                continue
            MEMORY_RELIEF.labels("pause").inc()
            log.warning("memory pressure: paused sandbox %s, the longest idle", sandbox_id)
