"""CPU time, of one process and of the whole machine: where a benchmark's cores went."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User and system CPU-seconds process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU-seconds all cores have been busy since boot (not idle, not waiting on I/O)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(n) for n in Path("/proc/stat").read_text().split(maxsplit=8)[1:8]
    )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
