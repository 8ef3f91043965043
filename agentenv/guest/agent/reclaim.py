"""Giving memory back while the guest is idle.

Once nobody has called the agent and its CPUs have been idle for a while, the kernel
drops clean caches, and free page reporting hands the freed pages back to the host. The
page cache it drops mostly holds the sandbox's image layers, which the host's page cache
holds once for every sandbox: reading them again after idle is cheap. A busy guest is
never touched; the host may also ask (`POST /reclaim`) when it runs short of memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("aenv_agent")

# Requests that do not count as use: the host's probes.
PROBES = frozenset({"/health", "/metrics"})


def _cpu_times(proc: Path) -> tuple[int, int]:
    """Total and idle jiffies of all CPUs."""
    try:
        fields = [int(x) for x in (proc / "stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)


def _mem_free(proc: Path) -> int:
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemFree:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class IdleReclaimer:
    """Reclaims once per idle period: after `idle_after` seconds without a request and
    with CPUs under `busy_pct` percent busy; 0 turns it off."""

    idle_after: float = 30.0
    sample_every: float = 5.0
    busy_pct: float = 10.0
    proc: Path = Path("/proc")
    reclaims: int = 0
    _active_at: float = 0.0
    _done: bool = False

    def __post_init__(self) -> None:
        self._active_at = time.monotonic()

    def touch(self) -> None:
        """Someone used the sandbox: the idle period starts again."""
        self._active_at = time.monotonic()
        self._done = False

    def idle_seconds(self) -> float:
        return max(0.0, time.monotonic() - self._active_at)

    async def run(self) -> None:
        """Sample until cancelled."""
        last = _cpu_times(self.proc)
        while True:
            await asyncio.sleep(self.sample_every)
            now = _cpu_times(self.proc)
            total, idle = now[0] - last[0], now[1] - last[1]
            last = now
            if total > 0 and 100.0 * (total - idle) / total > self.busy_pct:
                self.touch()
                continue
            if self.idle_after > 0 and not self._done and self.idle_seconds() >= self.idle_after:
                self._done = True
                await self.reclaim()

    async def reclaim(self) -> int:
        """Drop clean caches now; bytes freed."""
        freed = await asyncio.to_thread(self._reclaim)
        self.reclaims += 1
        log.info("reclaimed %d MiB after %.0f s idle", freed >> 20, self.idle_seconds())
        return freed

    def _reclaim(self) -> int:
        before = _mem_free(self.proc)
        vm = self.proc / "sys" / "vm"
        # Nothing is compacted: compaction moves pages the guest still uses, and a moved
        # page is written, which makes one the host shares with every clone of the
        # snapshot this sandbox's own. Free pages are reported one by one instead.
        (vm / "drop_caches").write_text("3\n")
        return max(0, _mem_free(self.proc) - before)
