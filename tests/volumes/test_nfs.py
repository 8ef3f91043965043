"""The node's NFS exports: ganesha's configuration, and which sandboxes each volume is
exported to, from the records alone (a fake store and server)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentenv.errors import InvalidInput, NotFound
from agentenv.net.plan import nfs_addresses, plan_network
from agentenv.runtime.machine.mounts import VolumeExports, guest_mounts, resolve_mounts
from agentenv.state.sandboxes import SandboxRecord
from agentenv.volumes.nfs import NfsExport, ganesha_config
from agentenv.volumes.registry import VolumeRecord


def test_ganesha_serves_nfsv3_alone_and_each_volume_to_its_clients() -> None:
    exports = [
        NfsExport(7, "vol-a", Path("/srv/volumes/vol-a"), ("10.1.0.2", "10.1.0.6")),
        NfsExport(8, "vol-b", Path("/srv/volumes/vol-b"), ()),
    ]
    text = ganesha_config("10.1.255.254", exports)
    for line in (
        "Protocols = 3;",
        "NFS_Port = 2049;",
        "MNT_Port = 20048;",
        "Enable_NLM = false;",
        "Enable_UDP = false;",
        "Bind_addr = 10.1.255.254;",
        "Mount_Path_Pseudo = true;",
        "EXPORT_DEFAULTS { Access_Type = None; Protocols = 3; Transports = TCP; }",
        "Export_Id = 7;",
        'Path = "/srv/volumes/vol-a";',
        'Pseudo = "/vol-a";',
        "Clients = 10.1.0.2, 10.1.0.6;",
    ):
        assert line in text, line
    # A volume no sandbox mounts is not exported at all.
    assert "vol-b" not in text
    assert text.count("EXPORT {") == 1


def test_the_nfs_server_has_the_last_slot_of_the_range() -> None:
    assert nfs_addresses("10.198.0.0/16") == ("10.198.255.253", "10.198.255.254")
    with pytest.raises(Exception, match="outside"):
        plan_network(
            16383, "x", name_prefix="p", host_subnet="10.198.0.0/16", guest_ip="169.254.0.21",
            guest_gateway="169.254.0.22", guest_prefix=30,
        )  # fmt: skip


class _Registry:
    def __init__(self, *volumes: VolumeRecord) -> None:
        self.volumes = {v.volume_id: v for v in volumes}

    async def get(self, key: str) -> VolumeRecord:
        for volume in self.volumes.values():
            if key in (volume.volume_id, volume.name):
                return volume
        raise NotFound(f"volume '{key}' not found")


class _Volumes:
    def __init__(self, *volumes: VolumeRecord) -> None:
        self.registry = _Registry(*volumes)

    def directory(self, record: VolumeRecord) -> Path:
        return Path("/volumes") / record.volume_id


class _Store:
    def __init__(self, records: list[SandboxRecord]) -> None:
        self.records = records

    async def list(self) -> list[SandboxRecord]:
        return list(self.records)


class _Server:
    def __init__(self) -> None:
        self.published: list[list[NfsExport]] = []

    async def publish(self, exports: list[NfsExport]) -> None:
        self.published.append(exports)


def _record(sandbox_id: str, slot: int, mounts: list[dict[str, str]]) -> Any:
    record = SandboxRecord.__new__(SandboxRecord)
    record.sandbox_id, record.slot, record.volume_mounts = sandbox_id, slot, mounts
    return record


def _plan(record: SandboxRecord) -> Any:
    return plan_network(
        record.slot, record.sandbox_id, name_prefix="p", host_subnet="10.198.0.0/16",
        guest_ip="169.254.0.21", guest_gateway="169.254.0.22", guest_prefix=30,
    )  # fmt: skip


def test_each_volume_is_exported_to_the_sandboxes_that_mount_it() -> None:
    a = VolumeRecord("vol-a", "data", "t", 0.0, 1)
    b = VolumeRecord("vol-b", "models", "t", 0.0, 2)
    mount_a = {"name": "data", "volumeID": "vol-a", "path": "/mnt/data"}
    mount_b = {"name": "models", "volumeID": "vol-b", "path": "/models"}
    gone = {"name": "gone", "volumeID": "vol-gone", "path": "/gone"}
    records = [
        _record("one", 0, [mount_a]),
        _record("two", 1, [mount_a, mount_b]),
        _record("plain", 2, []),
        _record("three", 3, [gone]),
    ]
    server = _Server()
    exports = VolumeExports(_Store(records), _Volumes(a, b), server, _plan)  # type: ignore[arg-type]
    asyncio.run(exports.publish())
    assert server.published == [
        [
            NfsExport(1, "vol-a", Path("/volumes/vol-a"), ("10.198.0.2", "10.198.0.6")),
            NfsExport(2, "vol-b", Path("/volumes/vol-b"), ("10.198.0.6",)),
        ]
    ]
    assert guest_mounts(records[1], "169.254.0.22") == [
        {"nfs_target": "169.254.0.22:/vol-a", "path": "/mnt/data"},
        {"nfs_target": "169.254.0.22:/vol-b", "path": "/models"},
    ]


def test_mounts_are_checked_before_anything_is_made() -> None:
    volumes = _Volumes(VolumeRecord("vol-a", "data", "t", 0.0, 1))

    def resolve(*mounts: dict[str, str]) -> list[dict[str, str]]:
        return asyncio.run(resolve_mounts(volumes, list(mounts)))  # type: ignore[arg-type]

    assert resolve({"name": "data", "path": "/mnt//data/"}) == [
        {"name": "data", "volumeID": "vol-a", "path": "/mnt/data"}
    ]
    for bad, message in (
        ({"name": "nope", "path": "/mnt"}, "not found"),
        ({"name": "data", "path": "relative"}, "absolute"),
        ({"name": "data", "path": "/usr"}, "cannot be mounted"),
        ({"name": "data", "path": "/"}, "cannot be mounted"),
        ({"name": "data", "path": "/a/../proc"}, "cannot be mounted"),
    ):
        with pytest.raises(InvalidInput, match=message):
            resolve(bad)
    with pytest.raises(InvalidInput, match="two volumes"):
        resolve({"name": "data", "path": "/a"}, {"name": "data", "path": "/a/"})
