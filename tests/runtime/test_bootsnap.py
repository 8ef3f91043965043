"""Boot snapshot bookkeeping with a stand-in driver (real VMs: e2e/test_boot_snapshots)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentenv.guest.kit import Kit
from agentenv.runtime.machine.bootsnap import BootSnapshots, Shape
from agentenv.vmm.driver import VmHandle, VmmError, VmSpec


class StubDriver:
    """Reports one leftover VM; every boot fails (the build's steps past cleanup are moot)."""

    name = "stub"

    def __init__(self, leftovers: dict[Path, int], version: str = "stub 1") -> None:
        self.leftovers = leftovers
        self.version = version
        self.killed: list[int] = []
        self.boots = 0

    def running_vms(self, root: Path) -> dict[Path, int]:
        return {w: p for w, p in self.leftovers.items() if w.parent == root}

    async def kill_pid(self, pid: int) -> None:
        self.killed.append(pid)

    async def boot(self, spec: VmSpec) -> VmHandle:
        self.boots += 1
        raise VmmError("stub boots nothing")


def _snapshots(root: Path, driver: StubDriver, kernel_args: str = "aenv.ip=1") -> BootSnapshots:
    kit = Kit(Path("/k"), Path("/i"), Path("/rt"), version="kit1")
    return BootSnapshots(root, kit, driver, kernel_args, "tcg", 5.0)  # type: ignore[arg-type]


def test_key_covers_shape_kernel_arguments_and_vmm_version(tmp_path: Path) -> None:
    snaps = _snapshots(tmp_path, StubDriver({}))
    keys = {
        snaps.key(Shape(1, 256)),
        snaps.key(Shape(2, 256)),
        snaps.key(Shape(1, 512)),
        _snapshots(tmp_path, StubDriver({}), "aenv.ip=2").key(Shape(1, 256)),
        _snapshots(tmp_path, StubDriver({}, "stub 2")).key(Shape(1, 256)),
    }
    assert len(keys) == 5
    assert snaps.key(Shape(1, 256)) == _snapshots(tmp_path, StubDriver({})).key(Shape(1, 256))


def test_ready_only_once_complete_and_discard_removes(tmp_path: Path) -> None:
    snaps = _snapshots(tmp_path, StubDriver({}))
    shape = Shape(1, 256)
    path = tmp_path / snaps.key(shape)
    path.mkdir()
    (path / "memory").write_bytes(b"")
    assert snaps.ready(shape) is None
    (path / "meta.json").write_text(json.dumps({"kit": "kit1"}))
    assert snaps.ready(shape) == path
    snaps.discard(shape)
    assert not path.exists()


@pytest.mark.skipif(not Path("/run").is_dir(), reason="needs /run")
def test_a_dead_servers_build_is_killed_and_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    shape = Shape(1, 256)
    key = _snapshots(tmp_path, StubDriver({})).key(shape)
    leftover = tmp_path / f"{key}.building"
    leftover.mkdir()
    (leftover / "memory").write_bytes(b"old")
    driver = StubDriver({leftover: 4242, tmp_path / "other.building": 99})
    snaps = _snapshots(tmp_path, driver)

    async def build() -> None:
        snaps.request(shape)
        await snaps.wait()

    asyncio.run(build())
    assert driver.killed == [4242]
    assert driver.boots == 1
    assert snaps.ready(shape) is None
    assert not leftover.exists()
    assert not Path(f"/run/netns/aenvsnap-{key[:8]}").exists()
