"""Volumes mounted into this node's sandboxes: what each guest mounts at /init, and the
node's NFS exports, derived from the sandbox records alone.

A volume is exported to the namespace address of every sandbox on this node whose record
mounts it, paused ones included (a paused sandbox keeps its slot). Exports are a second
gate: a sandbox reaches the NFS server at all only when its own namespace rules open it,
which they do only for a sandbox with mounts (`net/policy.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ...errors import InvalidInput, NotFound
from ...net.plan import NetworkPlan
from ...state.sandboxes import SandboxRecord, SandboxStore
from ...volumes.nfs import NfsExport, NfsServer
from ...volumes.service import Volumes

MAX_MOUNTS = 16
# Where the guest's own system lives; a volume over them would break the sandbox.
_RESERVED = ("/", "/proc", "/sys", "/dev", "/run", "/tmp", "/bin", "/sbin", "/lib", "/usr", "/etc")


def guest_mounts(record: SandboxRecord, server: str) -> list[dict[str, str]]:
    """`/init`'s volumeMounts for a sandbox's guest, as E2B's envd takes them."""
    return [
        {"nfs_target": f"{server}:/{mount['volumeID']}", "path": mount["path"]}
        for mount in record.volume_mounts
    ]


async def resolve_mounts(volumes: Volumes, requested: list[dict[str, Any]]) -> list[dict[str, str]]:
    """E2B's `volumeMounts` ([{name, path}]) checked, each with its volume's id."""
    if len(requested) > MAX_MOUNTS:
        raise InvalidInput(f"volumeMounts: at most {MAX_MOUNTS} volumes can be mounted")
    mounts: list[dict[str, str]] = []
    for raw in requested:
        name, path = raw.get("name"), raw.get("path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            raise InvalidInput("volumeMounts: each mount needs a volume name and a path")
        if not path.startswith("/") or "\0" in path or len(path) > 1024:
            raise InvalidInput(f"volumeMounts: path {path!r} must be absolute")
        normal = "/" + "/".join(part for part in path.split("/") if part not in ("", "."))
        if ".." in normal.split("/") or normal in _RESERVED:
            raise InvalidInput(f"volumeMounts: a volume cannot be mounted at {path!r}")
        if any(m["path"] == normal for m in mounts):
            raise InvalidInput(f"volumeMounts: two volumes at {normal}")
        try:
            volume = await volumes.registry.get(name)
        except NotFound:
            raise InvalidInput(f"volumeMounts: volume '{name}' not found") from None
        mounts.append({"name": volume.name, "volumeID": volume.volume_id, "path": normal})
    return mounts


class VolumeExports:
    """Publishes this node's exports whenever a sandbox with mounts comes or goes."""

    def __init__(
        self,
        store: SandboxStore,
        volumes: Volumes,
        server: NfsServer,
        plan: Callable[[SandboxRecord], NetworkPlan],
    ) -> None:
        self.store = store
        self.volumes = volumes
        self.server = server
        self._plan = plan
        # One publication at a time, each from a fresh read: a slow older one never
        # overwrites a newer one.
        self._lock = asyncio.Lock()

    async def publish(self) -> None:
        async with self._lock:
            clients: dict[str, set[str]] = {}
            for record in await self.store.list():
                for mount in record.volume_mounts:
                    clients.setdefault(mount["volumeID"], set()).add(self._plan(record).ns_ip)
            exports = []
            for volume_id, addresses in sorted(clients.items()):
                try:
                    volume = await self.volumes.registry.get(volume_id)
                except NotFound:
                    continue  # deleted under its sandboxes: its export goes
                exports.append(
                    NfsExport(
                        volume.export_id,
                        volume.volume_id,
                        self.volumes.directory(volume),
                        tuple(sorted(addresses)),
                    )
                )
            await self.server.publish(exports)
