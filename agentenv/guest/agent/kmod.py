"""Loading the kernel modules a guest needs only sometimes (NFS for volumes) from the
runtime disk, where the kit puts each set with its load order."""

from __future__ import annotations

import ctypes
import errno
import os

MODULES_DIR = "/opt/aenv/modules"
_SYS_FINIT_MODULE = 313  # x86_64


def load_module_set(name: str, directory: str = MODULES_DIR) -> None:
    """Load the set `name` in order; modules already loaded are skipped."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(os.path.join(directory, name, "load-order")) as fh:
        modules = fh.read().split()
    for module in modules:
        path = os.path.join(directory, name, f"{module}.ko")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if libc.syscall(_SYS_FINIT_MODULE, fd, b"", 0) != 0:
                err = ctypes.get_errno()
                if err != errno.EEXIST:
                    raise OSError(err, f"load module {module}: {os.strerror(err)}")
        finally:
            os.close(fd)
