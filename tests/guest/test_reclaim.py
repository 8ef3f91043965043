"""The agent's idle reclaim against a stand-in for /proc: once per idle period, never
while the CPUs are busy or someone uses the sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentenv.guest.agent.reclaim import IdleReclaimer


class FakeProc:
    """/proc/stat, /proc/meminfo, drop_caches, and compact_memory, which reclaim leaves alone."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "sys" / "vm").mkdir(parents=True)
        self.user = self.idle = 0
        self.tick(busy=False)
        (root / "meminfo").write_text("MemTotal: 500000 kB\nMemFree: 1000 kB\n")

    def tick(self, busy: bool) -> None:
        if busy:
            self.user += 100
        else:
            self.idle += 100
        (self.root / "stat").write_text(f"cpu  {self.user} 0 0 {self.idle} 0 0 0\ncpu0 0\n")

    def written(self) -> tuple[str, str]:
        vm = self.root / "sys" / "vm"
        return tuple(  # type: ignore[return-value]
            (vm / name).read_text() if (vm / name).exists() else ""
            for name in ("drop_caches", "compact_memory")
        )

    def clear(self) -> None:
        for name in ("drop_caches", "compact_memory"):
            (self.root / "sys" / "vm" / name).unlink(missing_ok=True)


async def _drive(proc: FakeProc, reclaimer: IdleReclaimer, busy: list[bool]) -> None:
    """One sample per entry of `busy`."""
    task = asyncio.create_task(reclaimer.run())
    try:
        for state in busy:
            proc.tick(state)
            await asyncio.sleep(reclaimer.sample_every * 1.5)
    finally:
        task.cancel()


@pytest.mark.parametrize(
    ("busy", "written", "reclaims"), [(False, ("3\n", ""), 1), (True, ("", ""), 0)]
)
def test_an_idle_guest_reclaims_once_and_a_busy_one_never(
    tmp_path: Path, busy: bool, written: tuple[str, str], reclaims: int
) -> None:
    proc = FakeProc(tmp_path)
    reclaimer = IdleReclaimer(idle_after=0.05, sample_every=0.02, proc=tmp_path)
    asyncio.run(_drive(proc, reclaimer, [busy] * 8))
    assert proc.written() == written
    assert reclaimer.reclaims == reclaims


def test_use_starts_a_new_idle_period(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    reclaimer = IdleReclaimer(idle_after=0.05, sample_every=0.02, proc=tmp_path)
    asyncio.run(_drive(proc, reclaimer, [False] * 6))
    assert reclaimer.reclaims == 1
    reclaimer.touch()
    assert reclaimer.idle_seconds() < 0.05
    proc.clear()
    asyncio.run(_drive(proc, reclaimer, [False] * 6))
    assert reclaimer.reclaims == 2 and proc.written() == ("3\n", "")


def test_zero_turns_it_off(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    reclaimer = IdleReclaimer(idle_after=0, sample_every=0.02, proc=tmp_path)
    asyncio.run(_drive(proc, reclaimer, [False] * 6))
    assert reclaimer.reclaims == 0
