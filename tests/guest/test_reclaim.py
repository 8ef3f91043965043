"""The agent's idle reclaim against a stand-in for /proc: once per idle period, never
while the CPUs are busy or someone uses the sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentenv.guest.agent.reclaim import IdleReclaimer


class FakeProc:
    """/proc/stat, /proc/meminfo, drop_caches and one slab cache's `shrink` in /sys."""

    def __init__(self, root: Path) -> None:
        self.proc, self.sys = root / "proc", root / "sys"
        (self.proc / "sys" / "vm").mkdir(parents=True)
        self.slab = self.sys / "kernel" / "slab" / "dentry"
        self.slab.mkdir(parents=True)
        (self.slab / "shrink").write_text("")
        self.user = self.idle = 0
        self.tick(busy=False)
        (self.proc / "meminfo").write_text("MemTotal: 500000 kB\nMemFree: 1000 kB\n")

    def reclaimer(self, idle_after: float) -> IdleReclaimer:
        return IdleReclaimer(idle_after, sample_every=0.02, proc=self.proc, sys=self.sys)

    def tick(self, busy: bool) -> None:
        if busy:
            self.user += 100
        else:
            self.idle += 100
        (self.proc / "stat").write_text(f"cpu  {self.user} 0 0 {self.idle} 0 0 0\ncpu0 0\n")

    def _files(self) -> tuple[Path, Path]:
        return self.proc / "sys" / "vm" / "drop_caches", self.slab / "shrink"

    def written(self) -> tuple[str, str]:
        return tuple(f.read_text() if f.exists() else "" for f in self._files())  # type: ignore[return-value]

    def clear(self) -> None:
        for f in self._files():
            f.write_text("")


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
    ("busy", "written", "reclaims"), [(False, ("3\n", "1\n"), 1), (True, ("", ""), 0)]
)
def test_an_idle_guest_reclaims_once_and_a_busy_one_never(
    tmp_path: Path, busy: bool, written: tuple[str, str], reclaims: int
) -> None:
    proc = FakeProc(tmp_path)
    reclaimer = proc.reclaimer(0.05)
    asyncio.run(_drive(proc, reclaimer, [busy] * 8))
    assert proc.written() == written
    assert reclaimer.reclaims == reclaims


def test_use_starts_a_new_idle_period(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    reclaimer = proc.reclaimer(0.05)
    asyncio.run(_drive(proc, reclaimer, [False] * 6))
    assert reclaimer.reclaims == 1
    reclaimer.touch()
    assert reclaimer.idle_seconds() < 0.05
    proc.clear()
    asyncio.run(_drive(proc, reclaimer, [False] * 6))
    assert reclaimer.reclaims == 2 and proc.written() == ("3\n", "1\n")


def test_zero_turns_it_off(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    reclaimer = proc.reclaimer(0)
    asyncio.run(_drive(proc, reclaimer, [False] * 6))
    assert reclaimer.reclaims == 0
