"""Opening paths inside a directory as if it were the root, with the kernel's openat2
(RESOLVE_IN_ROOT): a guest that mounts a volume may swap any component for a symlink at
any moment, and the kernel's resolution is the only one that cannot be raced."""

from __future__ import annotations

import ctypes
import errno
import os
import struct

_SYS_OPENAT2 = 437  # x86_64 and arm64
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """A file descriptor for `path` resolved inside `root_fd` (`..` stops at it, symlinks
    restart at it); OSError as open(2) raises it."""
    how = struct.pack("QQQ", flags | os.O_CLOEXEC, mode, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    buf = ctypes.create_string_buffer(how, len(how))
    while True:
        fd = _libc.syscall(_SYS_OPENAT2, root_fd, path.encode(), buf, len(how))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        # EAGAIN: a rename elsewhere raced the lookup; the kernel asks for a retry.
        if err not in (errno.EAGAIN, errno.EINTR):
            raise OSError(err, os.strerror(err), path)
