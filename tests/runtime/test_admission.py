"""Admission on committed resources: pure arithmetic over what sandboxes were promised."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentenv.config import SandboxConfig
from agentenv.errors import Unavailable
from agentenv.runtime.memory import admission
from agentenv.runtime.memory.admission import Capacity, Demand, admit, host_capacity

GIB = 1024


@pytest.fixture(autouse=True)
def roomy_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The live floors pass: these tests are about what is committed."""
    monkeypatch.setattr(admission, "available_memory_mb", lambda: 1 << 30)
    monkeypatch.setattr(admission, "available_disk_mb", lambda _path: 1 << 30)


def test_two_big_sandboxes_do_not_fit_a_24_gib_host(tmp_path: Path) -> None:
    capacity = Capacity(memory_mb=24 * GIB - 512, disk_mb=200 * GIB, max_vcpus=2)
    big = Demand(memory_mb=20_000, disk_mb=4096, vcpus=1)
    admit(big, [], capacity, SandboxConfig(), tmp_path)
    with pytest.raises(Unavailable, match="not enough host memory: sandboxes hold 20000 MiB"):
        admit(big, [big], capacity, SandboxConfig(), tmp_path)


def test_paused_sandboxes_hold_disk_not_memory(tmp_path: Path) -> None:
    capacity = Capacity(memory_mb=1000, disk_mb=10_000, max_vcpus=2)
    paused = Demand(memory_mb=0, disk_mb=4500, vcpus=0)
    admit(Demand(900, 4500, 1), [paused], capacity, SandboxConfig(), tmp_path)
    with pytest.raises(Unavailable, match="not enough host disk"):
        admit(Demand(100, 4500, 1), [paused, paused], capacity, SandboxConfig(), tmp_path)


def test_more_vcpus_than_the_node_allows_are_refused(tmp_path: Path) -> None:
    capacity = Capacity(memory_mb=10_000, disk_mb=10_000, max_vcpus=2)
    with pytest.raises(Unavailable, match="at most 2 vCPUs here, 16 asked"):
        admit(Demand(512, 100, 16), [], capacity, SandboxConfig(), tmp_path)


def test_live_floor_still_protects_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "available_memory_mb", lambda: 600)
    capacity = Capacity(memory_mb=10_000, disk_mb=10_000, max_vcpus=2)
    with pytest.raises(Unavailable, match="600 MiB available"):
        admit(Demand(512, 100, 1), [], capacity, SandboxConfig(), tmp_path)


def test_capacity_is_host_size_less_reserve_times_overcommit(tmp_path: Path) -> None:
    cfg = SandboxConfig(min_free_memory_mb=512, memory_overcommit=2.0, max_vcpus=0)
    capacity = host_capacity(cfg, tmp_path)
    assert capacity.memory_mb == (admission.total_memory_mb() - 512) * 2
    assert capacity.max_vcpus >= 1
    assert capacity.disk_mb < admission.total_disk_mb(tmp_path)
