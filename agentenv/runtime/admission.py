"""Admission: refuse a sandbox the host has no memory or disk for, before touching anything."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import Unavailable


def available_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError("MemAvailable missing from /proc/meminfo")


def available_disk_mb(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize // (1024 * 1024)


def admit(memory_mb: int, min_free_memory_mb: int, data_dir: Path, min_free_disk_mb: int) -> None:
    """Raise `Unavailable` (HTTP 503) when starting one more guest would starve the host."""
    free_mem = available_memory_mb()
    if free_mem - memory_mb < min_free_memory_mb:
        raise Unavailable(
            f"not enough host memory: {free_mem} MiB available, sandbox needs {memory_mb} MiB "
            f"and {min_free_memory_mb} MiB stay reserved"
        )
    free_disk = available_disk_mb(data_dir)
    if free_disk < min_free_disk_mb:
        raise Unavailable(
            f"not enough host disk: {free_disk} MiB free under {data_dir}, "
            f"{min_free_disk_mb} MiB stay reserved"
        )
