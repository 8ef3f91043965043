"""An idle guest's cold anonymous memory, compressed in place: swap on zram.

Dropping caches frees what is clean; an idle guest's processes (the agent's own Python
heap first of all) keep their written pages. Swapped to a zram device they are stored
compressed in guest memory, about a third of their size, and free page reporting hands the
rest back to the host. The next burst faults them back in from memory, not from a disk.
Set up on the first idle reclaim, not at boot: a guest that never idles never pays.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import subprocess
from pathlib import Path

from . import machine
from .kmod import load_module_set

log = logging.getLogger("aenv_agent")

ZRAM = "/dev/zram0"
CGROUP = "/sys/fs/cgroup"
# The swap device's size, as a share of the guest's memory (what it may hold uncompressed).
SWAP_FRACTION = 0.5


def _mem_total(proc: Path) -> int:
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError(errno.ENOENT, "no MemTotal in meminfo")


class ColdMemory:
    """Swap on zram, made once; `push_out` reclaims what the guest holds into it."""

    def __init__(self, proc: Path = Path("/proc"), sys: Path = Path("/sys")) -> None:
        self._proc = proc
        self._sys = sys
        self._ready = False
        self._failed = False

    def _set_up(self) -> None:
        load_module_set("zram")
        block = self._sys / "block" / "zram0"
        (block / "comp_algorithm").write_text("lzo-rle\n")
        (block / "disksize").write_text(f"{int(_mem_total(self._proc) * SWAP_FRACTION)}\n")
        subprocess.run(["mkswap", ZRAM], check=True, capture_output=True)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.swapon(ZRAM.encode(), 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"swapon {ZRAM}: {os.strerror(err)}")
        # Reclaim may take anonymous pages as readily as cache: they go to memory, not disk.
        (self._proc / "sys" / "vm" / "swappiness").write_text("100\n")
        if not os.path.exists(f"{CGROUP}/memory.reclaim"):
            # The agent's own view of the hierarchy; the user's /sys is another mount.
            machine.mount("cgroup2", CGROUP, "cgroup2")

    def push_out(self) -> None:
        """Reclaim all the guest can spare into compressed swap (set up on first use)."""
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
        try:
            # As much as there is: the kernel stops, with EAGAIN, when nothing more goes.
            Path(CGROUP, "memory.reclaim").write_text(f"{_mem_total(self._proc)}\n")
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise
