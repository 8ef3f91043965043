"""Volumes the node serves over NFSv3, mounted into the user's view at ``/init``.

The request names each mount as E2B's envd does: ``{"nfs_target": "host:/export",
"path": "/mnt/data"}``. The kernel's NFS client does the MOUNT call itself, so the guest
needs no mount helper, portmapper or lock daemon.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from dataclasses import dataclass

from . import machine
from .rootfs import RootFS

log = logging.getLogger(__name__)

MODULES_DIR = "/opt/aenv/modules"
NFS_PORT = 2049
MOUNT_PORT = 20048
_SYS_FINIT_MODULE = 313  # x86_64
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


def load_nfs_modules(directory: str = MODULES_DIR) -> None:
    """Load the NFS client's modules from the runtime disk (once; loaded ones are skipped)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(os.path.join(directory, "load-order")) as fh:
        names = fh.read().split()
    for name in names:
        fd = os.open(os.path.join(directory, f"{name}.ko"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.syscall(_SYS_FINIT_MODULE, fd, b"", 0) != 0:
                err = ctypes.get_errno()
                if err != errno.EEXIST:
                    raise OSError(err, f"load module {name}: {os.strerror(err)}")
        finally:
            os.close(fd)


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
    load_nfs_modules()
    for mount in mounts:
        target = rootfs.host(mount.path)
        source = f"{mount.server}:{mount.export}"
        if _mounted_nfs(target, source):
            continue
        os.makedirs(target, mode=0o755, exist_ok=True)
        options = f"{NFS_OPTIONS},addr={mount.server},mountaddr={mount.server}"
        machine.mount(source, target, "nfs", 0, options)
        log.info("mounted volume %s at %s", source, mount.path)
