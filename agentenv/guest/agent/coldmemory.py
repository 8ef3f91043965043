"""An idle guest's cold anonymous memory, compressed in place: swap on zram.

Dropping caches frees what is clean; an idle guest's processes (the agent's own Python
heap first of all) keep their written pages. Paged out to a zram device they are stored
compressed in guest memory, about a third of their size, and free page reporting hands the
rest back to the host. The next burst faults them back in from memory, not from a disk.

Only anonymous memory goes (`process_madvise(MADV_PAGEOUT)` over each process's private
writable ranges), never mapped files: a library or binary a guest maps is mostly the boot
snapshot's page, which every clone shares on the host; evicted and read again it would be
each guest's own copy. Set up on the first idle reclaim, not at boot: a guest that never
idles never pays.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from .kmod import load_module_set

log = logging.getLogger("aenv_agent")

ZRAM = "/dev/zram0"
# The swap device's size, as a share of the guest's memory (what it may hold uncompressed).
SWAP_FRACTION = 0.5
_SYS_PIDFD_OPEN = 434
_SYS_PROCESS_MADVISE = 440
_MADV_PAGEOUT = 21
# Mappings of no file that a process writes: heap, stacks, anonymous memory.
_ANONYMOUS_NAMES = ("", "[heap]", "[stack]")


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _mem_total(proc: Path) -> int:
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError(errno.ENOENT, "no MemTotal in meminfo")


def anonymous_ranges(maps: str) -> Iterator[tuple[int, int]]:
    """(start, length) of each private, writable mapping of no file in a `maps` text."""
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 5:
            continue
        name = fields[5].strip() if len(fields) > 5 else ""
        perms = fields[1]
        if perms[1] == "w" and perms[3] == "p" and name in _ANONYMOUS_NAMES:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            yield start, end - start


class ColdMemory:
    """Swap on zram, made once; `push_out` pages every process's anonymous memory out."""

    def __init__(self, proc: Path = Path("/proc"), sys: Path = Path("/sys")) -> None:
        self._proc = proc
        self._sys = sys
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._ready = False
        self._failed = False

    def _set_up(self) -> None:
        load_module_set("zram")
        block = self._sys / "block" / "zram0"
        (block / "comp_algorithm").write_text("lzo-rle\n")
        (block / "disksize").write_text(f"{int(_mem_total(self._proc) * SWAP_FRACTION)}\n")
        subprocess.run(["mkswap", ZRAM], check=True, capture_output=True)
        if self._libc.swapon(ZRAM.encode(), 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"swapon {ZRAM}: {os.strerror(err)}")

    def push_out(self) -> None:
        """Page out what every process wrote (swap set up on first use)."""
        if self._failed:
            return
        if not self._ready:
            try:
                self._set_up()
            except (OSError, subprocess.CalledProcessError) as exc:
                # A kit without the modules, say: caches are still dropped.
                log.warning("no compressed swap: %s", exc)
                self._failed = True
                return
            self._ready = True
        for entry in self._proc.iterdir():
            if entry.name.isdigit():
                self._page_out(int(entry.name))

    def _page_out(self, pid: int) -> None:
        try:
            maps = (self._proc / str(pid) / "maps").read_text()
        except OSError:
            return  # gone meanwhile
        ranges = list(anonymous_ranges(maps))
        if not ranges:
            return  # a kernel thread
        pidfd = self._libc.syscall(_SYS_PIDFD_OPEN, pid, 0)
        if pidfd < 0:
            return
        try:
            for start, length in ranges:
                # One range a call: a range the kernel refuses (locked, say) stops only itself.
                vec = _IoVec(start, length)
                self._libc.syscall(
                    _SYS_PROCESS_MADVISE, pidfd, ctypes.byref(vec), 1, _MADV_PAGEOUT, 0
                )
        finally:
            os.close(pidfd)
