"""Directory watching with inotify through ctypes (no third-party packages in the guest).

Event kinds follow Go's fsnotify, which envd uses: create/moved-to -> CREATE, modify -> WRITE,
delete -> REMOVE, moved-from -> RENAME, attrib -> CHMOD. Names are relative to the watched dir.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import struct
from collections.abc import Callable

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
)
_EVENT = struct.Struct("iIII")

# (inotify bits, EventType name), in the order fsnotify reports them.
KINDS = [
    (IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"),
    (IN_MODIFY, "EVENT_TYPE_WRITE"),
    (IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"),
    (IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"),
    (IN_ATTRIB, "EVENT_TYPE_CHMOD"),
]

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL("libc.so.6", use_errno=True)
    return _libc


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


# Superblock magics of network filesystems (linux/magic.h): NFS, CIFS, SMB, SMB2, FUSE.
NETWORK_FS_MAGICS = {0x6969, 0xFF534D42, 0x517B, 0xFE534D42, 0x65735546}
# struct statfs: f_type is its first field, a long; the whole struct is under 128 bytes.
_STATFS_SIZE = 128


def on_network_mount(path: str) -> bool:
    """True when `path` lies on a network filesystem, where inotify misses remote changes
    (envd refuses to watch there unless asked)."""
    buf = ctypes.create_string_buffer(_STATFS_SIZE)
    _check(_lib().statfs(os.fsencode(path), buf), f"statfs {path}")
    f_type = ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF
    return f_type in NETWORK_FS_MAGICS


# Called with (relative name, EventType name, host path of the entry).
EventCallback = Callable[[str, str, str], None]


class DirWatcher:
    """One inotify instance watching a directory (and, if recursive, every subdirectory)."""

    def __init__(self, host_dir: str, recursive: bool, callback: EventCallback) -> None:
        self.root = host_dir.rstrip("/") or "/"
        self.recursive = recursive
        self.callback = callback
        self._wds: dict[int, str] = {}
        self._fd = _check(_lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")
        try:
            self._add(self.root, strict=True)
            if recursive:
                self._add_tree(self.root)
        except BaseException:
            os.close(self._fd)
            raise
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._on_readable)

    def _add(self, host_dir: str, strict: bool = False) -> None:
        wd = _lib().inotify_add_watch(self._fd, os.fsencode(host_dir), WATCH_MASK | IN_ONLYDIR)
        if wd < 0:
            if strict:
                _check(wd, f"watch {host_dir}")
            return  # raced with a removal, or not a directory any more
        self._wds[wd] = host_dir

    def _add_tree(self, host_dir: str) -> None:
        for parent, dirs, _files in os.walk(host_dir):
            for name in dirs:
                self._add(os.path.join(parent, name))

    def _on_readable(self) -> None:
        try:
            buf = os.read(self._fd, 64 * 1024)
        except OSError as err:
            if err.errno in (errno.EAGAIN, errno.EINTR):
                return
            raise
        offset = 0
        while offset + _EVENT.size <= len(buf):
            wd, mask, _cookie, length = _EVENT.unpack_from(buf, offset)
            raw = buf[offset + _EVENT.size : offset + _EVENT.size + length]
            offset += _EVENT.size + length
            self._dispatch(wd, mask, os.fsdecode(raw.rstrip(b"\0")))

    def _dispatch(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_IGNORED:
            self._wds.pop(wd, None)
            return
        base = self._wds.get(wd)
        if base is None:
            return
        host = os.path.join(base, name) if name else base
        if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            self._add(host)
            self._add_tree(host)
        if base != self.root and not name:
            return  # a subdirectory's own delete/move is already reported by its parent
        rel = os.path.relpath(host, self.root)
        rel = "" if rel == "." else rel
        for bits, kind in KINDS:
            if mask & bits:
                self.callback(rel, kind, host)

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
