"""Admission: refuse a sandbox the host cannot hold, before anything is touched.

Sandboxes are counted at their configured size (committed), not by what they use now:
RAM files are sparse and a guest grows into its memory later, so free memory today says
little about tomorrow. A live floor of free memory and disk protects the host as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...config import SandboxConfig
from ...errors import AtCapacity, PermanentlyUnavailable
from ...state.sandboxes import Footprint, SandboxRecord


@dataclass(frozen=True)
class Demand:
    """What one sandbox commits: guest memory, and disk for its overlay and RAM file."""

    memory_mb: int
    disk_mb: int
    vcpus: int


@dataclass(frozen=True)
class Capacity:
    memory_mb: int
    disk_mb: int
    max_vcpus: int


def demand_of(record: SandboxRecord | Footprint) -> Demand:
    # A sandbox's disk holds its overlay and, while paused, its RAM file.
    return Demand(record.memory_mb, record.disk_mb + record.memory_mb, record.vcpus)


def committed_by(records: Sequence[SandboxRecord | Footprint]) -> list[Demand]:
    """What these sandboxes hold: paused ones hold disk but no memory."""
    return [
        demand_of(r) if r.state.holds_memory else Demand(0, demand_of(r).disk_mb, 0)
        for r in records
    ]


def total_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    return _meminfo_mb("MemTotal", meminfo)


def available_memory_mb(meminfo: Path = Path("/proc/meminfo")) -> int:
    return _meminfo_mb("MemAvailable", meminfo)


def _meminfo_mb(key: str, meminfo: Path) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) // 1024
    raise RuntimeError(f"{key} missing from {meminfo}")


def available_disk_mb(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize // 2**20


def total_disk_mb(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_blocks * stat.f_frsize // 2**20


def host_capacity(cfg: SandboxConfig, data_dir: Path) -> Capacity:
    """What sandboxes may commit on this host: its memory and disk less the reserves,
    times the configured overcommit."""
    memory = (total_memory_mb() - cfg.min_free_memory_mb) * cfg.memory_overcommit
    disk = (total_disk_mb(data_dir) - cfg.min_free_disk_mb) * cfg.disk_overcommit
    return Capacity(int(memory), int(disk), max_vcpus(cfg))


def max_vcpus(cfg: SandboxConfig) -> int:
    """The most vCPUs one sandbox may have here: configured, else the host's CPUs."""
    return cfg.max_vcpus or os.cpu_count() or 1


def admit(
    demand: Demand,
    committed: Iterable[Demand],
    capacity: Capacity,
    cfg: SandboxConfig,
    data_dir: Path,
) -> None:
    """Raise `AtCapacity` (HTTP 429) naming the resource when `demand` does not fit now;
    `PermanentlyUnavailable` when it never can."""
    if demand.vcpus > capacity.max_vcpus:
        raise PermanentlyUnavailable(
            f"a sandbox may have at most {capacity.max_vcpus} vCPUs here, {demand.vcpus} asked"
        )
    committed = list(committed)
    memory = sum(d.memory_mb for d in committed)
    if memory + demand.memory_mb > capacity.memory_mb:
        raise AtCapacity(
            f"not enough host memory: sandboxes hold {memory} MiB of {capacity.memory_mb} MiB, "
            f"this one needs {demand.memory_mb} MiB"
        )
    disk = sum(d.disk_mb for d in committed)
    if disk + demand.disk_mb > capacity.disk_mb:
        raise AtCapacity(
            f"not enough host disk: sandboxes hold {disk} MiB of {capacity.disk_mb} MiB, "
            f"this one needs {demand.disk_mb} MiB"
        )
    free_mem = available_memory_mb()
    if free_mem - demand.memory_mb < cfg.min_free_memory_mb:
        raise AtCapacity(
            f"not enough host memory: {free_mem} MiB available, sandbox needs "
            f"{demand.memory_mb} MiB and {cfg.min_free_memory_mb} MiB stay reserved"
        )
    free_disk = available_disk_mb(data_dir)
    if free_disk < cfg.min_free_disk_mb:
        raise AtCapacity(
            f"not enough host disk: {free_disk} MiB free under {data_dir}, "
            f"{cfg.min_free_disk_mb} MiB stay reserved"
        )
