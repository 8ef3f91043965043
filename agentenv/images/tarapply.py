"""Apply one OCI layer tar to a directory tree (a mounted image), streaming, with whiteouts.

Paths are confined to the root: a `..` component is refused, and a symlink met while
resolving a parent directory is followed inside the root only (as in a chroot, like
containerd's apply), never on the host; the leaf itself is never followed. Supported:
regular files (zero runs become holes), directories, symlinks, hard links, device nodes,
fifos, numeric ownership, modes (setuid/setgid/sticky), mtimes, xattrs (SCHILY.xattr.* and
LIBARCHIVE.xattr.*), whiteouts and opaque directories. Not supported: POSIX ACLs carried
only as SCHILY.acl.* headers (dropped), atime other than the mtime, and the aufs
`.wh..wh.plnk` hard-link directories (ignored). Input may be plain, gzip, zstd, bzip2 or xz.
"""

from __future__ import annotations

import base64
import bz2
import errno
import gzip
import hashlib
import io
import lzma
import os
import shutil
import stat
import tarfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
_COPY = 1024 * 1024
_HOLE = 64 * 1024
_MAX_SYMLINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TarApplyError(Exception):
    """The tar is malformed or unsafe; the message names the member."""


@dataclass
class ApplyResult:
    entries: int
    bytes: int
    diff_id: str  # "sha256:<hex>" of the uncompressed tar stream


class _Hashing(io.RawIOBase):
    """Pass-through reader that hashes what it reads (the diff id is over the plain tar)."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self.sha = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._inner.read(size)
        self.sha.update(data)
        return data

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)


class _Prefixed(io.RawIOBase):
    """A stream with its first bytes already read back in front (to sniff compression)."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self._head:
            n = len(self._head) if size < 0 else min(size, len(self._head))
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._rest.read(size)

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)


def open_uncompressed(raw: BinaryIO) -> BinaryIO:
    """The plain tar stream of a layer blob, whatever its (sniffed) compression."""
    head = raw.read(6)
    src: BinaryIO = _Prefixed(head, raw)  # type: ignore[assignment]
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=src, mode="rb")  # type: ignore[return-value]
    if head.startswith(b"\x28\xb5\x2f\xfd"):
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True)
    if head.startswith(b"BZh"):
        return bz2.BZ2File(src)  # type: ignore[return-value]
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(src)  # type: ignore[return-value]
    return src


def split_name(name: str) -> list[str]:
    """Components of a member path relative to the root; refuses `..`."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise TarApplyError(f"{name!r}: `..` in a layer path is refused")
    return parts


def _is_real_dir(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISDIR(st.st_mode)


class _Applier:
    """One tar over one root; all file system access goes through directory fds."""

    def __init__(self, root: Path) -> None:
        self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # Entries this layer wrote, as (dev, parent inode, name): immune to whiteouts and
        # opaque markers of the same layer, whatever path (symlinked or not) named them.
        self.created: set[tuple[int, int, str]] = set()
        self.dir_times: list[tuple[list[str], int]] = []
        self.bytes = 0

    def close(self) -> None:
        os.close(self.root_fd)

    # -- resolution -------------------------------------------------------------------
    def open_dir(self, parts: list[str], *, create: bool) -> int:
        """An fd of directory `parts`, symlinks resolved inside the root; makes missing dirs."""
        stack = [os.dup(self.root_fd)]
        pending = list(reversed(parts))
        hops = 0
        try:
            while pending:
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":  # only reachable via symlink targets; clamps at the root
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                cur = stack[-1]
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=cur)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(name, 0o755, dir_fd=cur)
                    fd = os.open(name, _DIR_FLAGS, dir_fd=cur)
                    os.fchmod(fd, 0o755)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    st = os.stat(name, dir_fd=cur, follow_symlinks=False)
                    if not stat.S_ISLNK(st.st_mode):
                        raise NotADirectoryError(errno.ENOTDIR, "not a directory", name) from None
                    hops += 1
                    if hops > _MAX_SYMLINKS:
                        raise OSError(errno.ELOOP, "too many symlinks", name) from None
                    target = os.readlink(name, dir_fd=cur)
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop())
                    pending.extend(reversed(target.split("/")))
                    continue
                stack.append(fd)
            return stack.pop()
        finally:
            for fd in stack:
                os.close(fd)

    def _key(self, parent: int, name: str) -> tuple[int, int, str]:
        st = os.fstat(parent)
        return (st.st_dev, st.st_ino, name)

    @staticmethod
    def _lstat(parent: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None

    @staticmethod
    def _remove(parent: int, name: str, st: os.stat_result) -> None:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=parent)  # fd-based: never follows symlinks
        else:
            os.unlink(name, dir_fd=parent)

    def _clear(self, parent: int, name: str, *, want_dir: bool) -> bool:
        """Make room for `name`; an existing directory stays when a directory comes."""
        st = self._lstat(parent, name)
        if st is None:
            return False
        if want_dir and _is_real_dir(st):
            return True
        self._remove(parent, name, st)
        return False

    # -- whiteouts --------------------------------------------------------------------
    def whiteout(self, parts: list[str]) -> None:
        try:
            parent = self.open_dir(parts[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError):
            return  # nothing below to hide
        try:
            base = parts[-1]
            if base == OPAQUE:
                self._opaque(parent)
            elif base.startswith(WHITEOUT + WHITEOUT):
                return  # aufs metadata (.wh..wh.plnk etc.), meaningless here
            else:
                name = base[len(WHITEOUT) :]
                if self._key(parent, name) in self.created:
                    return  # whiteouts hide lower layers only
                st = self._lstat(parent, name)
                if st is not None:
                    self._remove(parent, name, st)
        finally:
            os.close(parent)

    def _opaque(self, dfd: int) -> None:
        """Drop what lower layers had in the directory, keeping this layer's entries."""
        for name in os.listdir(dfd):
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if self._key(dfd, name) not in self.created:
                self._remove(dfd, name, st)
            elif stat.S_ISDIR(st.st_mode):
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
                try:
                    self._opaque(sub)
                finally:
                    os.close(sub)

    # -- entries ----------------------------------------------------------------------
    def entry(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        parts = split_name(m.name)
        if parts and parts[-1].startswith(WHITEOUT):
            self.whiteout(parts)
            return
        if not parts:  # the root itself ("./"): only its metadata
            if m.isdir():
                self._meta_fd(self.root_fd, m)
                self.dir_times.append(([], int(m.mtime * 1e9)))
            return
        parent = self.open_dir(parts[:-1], create=True)
        try:
            name = parts[-1]
            if m.islnk():
                self._hardlink(parent, name, m)
            elif m.isdir():
                if not self._clear(parent, name, want_dir=True):
                    os.mkdir(name, 0o700, dir_fd=parent)
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
                try:
                    self._meta_fd(fd, m)
                finally:
                    os.close(fd)
                self.dir_times.append((parts, int(m.mtime * 1e9)))
            elif m.isreg():
                self._clear(parent, name, want_dir=False)
                self._regular(tf, parent, name, m)
            elif m.issym():
                self._clear(parent, name, want_dir=False)
                os.symlink(m.linkname, name, dir_fd=parent)
                self._meta_path(parent, name, m, symlink=True)
            elif m.ischr() or m.isblk() or m.isfifo():
                self._clear(parent, name, want_dir=False)
                if m.isfifo():
                    os.mkfifo(name, 0o600, dir_fd=parent)
                else:
                    kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK
                    dev = os.makedev(m.devmajor, m.devminor)
                    os.mknod(name, kind | 0o600, dev, dir_fd=parent)
                self._meta_path(parent, name, m, symlink=False)
            else:
                raise TarApplyError(f"{m.name!r}: unsupported tar entry type {m.type!r}")
            self.created.add(self._key(parent, name))
        finally:
            os.close(parent)

    def _hardlink(self, parent: int, name: str, m: tarfile.TarInfo) -> None:
        target = split_name(m.linkname)
        if not target:
            raise TarApplyError(f"{m.name!r}: hard link to the root")
        try:
            src = self.open_dir(target[:-1], create=False)
        except (FileNotFoundError, NotADirectoryError):
            raise TarApplyError(f"{m.name!r}: hard link target {m.linkname!r} missing") from None
        try:
            src_st = self._lstat(src, target[-1])
            if src_st is None or stat.S_ISDIR(src_st.st_mode):
                raise TarApplyError(f"{m.name!r}: hard link target {m.linkname!r} missing")
            dst_st = self._lstat(parent, name)
            if dst_st is not None and (dst_st.st_dev, dst_st.st_ino) == (
                src_st.st_dev,
                src_st.st_ino,
            ):
                return  # already the same inode
            self._clear(parent, name, want_dir=False)
            os.link(target[-1], name, src_dir_fd=src, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            os.close(src)

    def _regular(self, tf: tarfile.TarFile, parent: int, name: str, m: tarfile.TarInfo) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=parent)
        try:
            src = tf.extractfile(m)
            pos = 0
            while src is not None and (buf := src.read(_COPY)):
                view = memoryview(buf)
                for lo in range(0, len(buf), _HOLE):
                    piece = view[lo : lo + _HOLE]
                    if buf.count(0, lo, lo + _HOLE) != len(piece):  # zero runs stay holes
                        _pwrite_all(fd, piece, pos + lo)
                pos += len(buf)
            self.bytes += pos
            os.ftruncate(fd, m.size)
            self._meta_fd(fd, m)
        finally:
            os.close(fd)

    def _meta_fd(self, fd: int, m: tarfile.TarInfo) -> None:
        # chown first: it clears setuid/setgid and security.capability.
        os.fchown(fd, m.uid, m.gid)
        for key, value in _xattrs(m):
            os.setxattr(fd, key, value)
        os.fchmod(fd, stat.S_IMODE(m.mode))
        if not m.isdir():  # directories get their times last, after their children
            os.utime(fd, ns=(int(m.mtime * 1e9),) * 2)

    def _meta_path(self, parent: int, name: str, m: tarfile.TarInfo, *, symlink: bool) -> None:
        os.chown(name, m.uid, m.gid, dir_fd=parent, follow_symlinks=False)
        # The /proc path resolves the parent through its fd; the leaf is not followed.
        path = f"/proc/self/fd/{parent}/{name}"
        for key, value in _xattrs(m):
            try:
                os.setxattr(path, key, value, follow_symlinks=False)
            except OSError as exc:
                if not (symlink and exc.errno in (errno.EPERM, errno.ENOTSUP)):
                    raise  # user.* xattrs cannot exist on symlinks: dropped
        if not symlink:
            pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            try:
                os.chmod(f"/proc/self/fd/{pfd}", stat.S_IMODE(m.mode))
            finally:
                os.close(pfd)
        os.utime(name, ns=(int(m.mtime * 1e9),) * 2, dir_fd=parent, follow_symlinks=False)

    def finish(self) -> None:
        """Set directory mtimes now that nothing more is written into them."""
        for parts, mtime in reversed(self.dir_times):
            try:
                fd = self.open_dir(parts, create=False)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed later in the same layer
            try:
                os.utime(fd, ns=(mtime, mtime))
            finally:
                os.close(fd)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    # A short write (the file system filling up) must not silently truncate the file.
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _xattrs(m: tarfile.TarInfo) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for key, value in m.pax_headers.items():
        if key.startswith("SCHILY.xattr."):
            # tarfile decoded the raw value as UTF-8 with surrogateescape: this undoes it.
            out.append((key[len("SCHILY.xattr.") :], value.encode("utf-8", "surrogateescape")))
        elif key.startswith("LIBARCHIVE.xattr."):
            name = urllib.parse.unquote(key[len("LIBARCHIVE.xattr.") :])
            out.append((name, base64.b64decode(value + "=" * (-len(value) % 4))))
    return out


def apply_tar(
    layer: BinaryIO, root: Path, *, progress: Callable[[int], None] | None = None
) -> ApplyResult:
    """Apply the layer blob read from `layer` onto the tree at `root`, streaming.

    `progress(entries)` is called every 1000 entries. Raises TarApplyError or OSError.
    """
    plain = _Hashing(open_uncompressed(layer))
    applier = _Applier(root)
    entries = 0
    try:
        try:
            tf = tarfile.open(fileobj=plain, mode="r|")
            for member in tf:
                applier.entry(tf, member)
                # Stream mode would otherwise keep every TarInfo; typeshed omits `members`.
                tf.members = []  # type: ignore[attr-defined]
                entries += 1
                if progress and entries % 1000 == 0:
                    progress(entries)
        except tarfile.TarError as exc:
            raise TarApplyError(f"bad tar stream after {entries} entries: {exc}") from exc
        applier.finish()
    finally:
        applier.close()
    while plain.read(_COPY):  # the diff id covers the end-of-archive padding too
        pass
    return ApplyResult(entries, applier.bytes, "sha256:" + plain.sha.hexdigest())
