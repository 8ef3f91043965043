"""Volumes the node serves over NFSv3, mounted into the user's view at ``/init``.

The request names each mount as E2B's envd does: ``{"nfs_target": "host:/export",
"path": "/mnt/data"}``. The kernel's NFS client does the MOUNT call itself, so the guest
needs no mount helper, portmapper or lock daemon.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from . import machine
from .kmod import load_module_set
from .rootfs import RootFS

log = logging.getLogger(__name__)

NFS_PORT = 2049
MOUNT_PORT = 20048
# As E2B's envd mounts: a hard mount that writes through and caches no attributes or
# lookups, so what a paused guest held is not stale when it resumes and the volume's
# content API sees every write. No NLM: locks are the guest's own.
NFS_OPTIONS = (
    f"vers=3,proto=tcp,port={NFS_PORT},mountproto=tcp,mountport={MOUNT_PORT},mountvers=3,"
    "hard,sync,noac,lookupcache=none,nolock,noacl,rsize=1048576,wsize=1048576"
)


@dataclass(frozen=True)
class VolumeMount:
    server: str
    export: str
    path: str

    @classmethod
    def parse(cls, raw: object) -> VolumeMount:
        if not isinstance(raw, dict):
            raise ValueError("a volume mount must be an object")
        target, path = raw.get("nfs_target"), raw.get("path")
        if not isinstance(target, str) or not isinstance(path, str):
            raise ValueError("a volume mount needs nfs_target and path")
        server, sep, export = target.partition(":")
        if not sep or not server or not export.startswith("/") or not path.startswith("/"):
            raise ValueError(f"bad volume mount {target!r} at {path!r}")
        return cls(server, export, path)


def _mounted_nfs(target: str, source: str) -> bool:
    """Whether `source` is already mounted at `target` (a fork's guest keeps its mounts)."""
    with open("/proc/self/mounts") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 3 and fields[1] == target and fields[0] == source:
                return fields[2] == "nfs"
    return False


def mount_volumes(rootfs: RootFS, mounts: list[VolumeMount]) -> None:
    """Mount each volume at its path in the user's root (made, as root, when missing)."""
    if not mounts:
        return
    load_module_set("nfs")
    for mount in mounts:
        target = rootfs.host(mount.path)
        source = f"{mount.server}:{mount.export}"
        if _mounted_nfs(target, source):
            continue
        os.makedirs(target, mode=0o755, exist_ok=True)
        options = f"{NFS_OPTIONS},addr={mount.server},mountaddr={mount.server}"
        machine.mount(source, target, "nfs", 0, options)
        log.info("mounted volume %s at %s", source, mount.path)
