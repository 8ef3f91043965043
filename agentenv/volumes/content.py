"""A volume's files on this node, as E2B's volume content API serves them.

Guests that mount the volume write to it at the same time and may swap any path
component for a symlink at any moment. So every path is resolved by the kernel inside the
volume's directory (`inroot.py`: `..` stops at its root, symlinks restart there), and
every operation then works on the final name relative to its parent directory's file
descriptor, never following it: no request reaches, or changes, a file outside the volume.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import Conflict, InvalidInput, NotFound, TooLarge
from .inroot import open_in_root

DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755
CHUNK = 256 * 1024
# A path that does not resolve to something there.
_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _type(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "file" if stat.S_ISREG(mode) else "unknown"


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


class VolumeFiles:
    """The files of one volume, rooted at `root` (a directory of the node's)."""

    def __init__(self, root: Path, spool: Path) -> None:
        self._root = root
        # Uploads are written here, then renamed into place (one file system): a crash
        # mid-upload leaves nothing in the volume, and the node clears this at start.
        self._spool = spool

    @staticmethod
    def normalize(path: str) -> str:
        """A client's path as an absolute one inside the volume."""
        return posixpath.normpath("/" + path.strip().lstrip("/"))

    @contextlib.contextmanager
    def _root_fd(self) -> Iterator[int]:
        fd = os.open(self._root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _open(root: int, guest: str, flags: int) -> int:
        """`guest` opened inside the volume; NotFound when it does not resolve there."""
        try:
            return open_in_root(root, guest, flags)
        except OSError as exc:
            if exc.errno in _MISSING:
                raise NotFound(f"Path {guest} not found") from None
            raise

    @contextlib.contextmanager
    def _at(self, guest: str) -> Iterator[tuple[int, str]]:
        """The directory holding `guest` (a descriptor) and its final name; NotFound
        naming the parent when that is not a directory in the volume."""
        parent, name = posixpath.split(guest)
        with self._root_fd() as root:
            if guest == "/":
                yield root, "."
                return
            fd = self._open(root, parent, os.O_PATH | os.O_DIRECTORY)
            try:
                yield fd, name
            finally:
                os.close(fd)

    @staticmethod
    def _lstat_at(fd: int, name: str, guest: str) -> os.stat_result:
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in _MISSING:
                raise NotFound(f"Path {guest} not found") from None
            raise

    def stat(self, path: str) -> dict[str, Any]:
        guest = self.normalize(path)
        try:
            with self._at(guest) as (fd, name):
                return self._entry(guest, self._lstat_at(fd, name, guest), fd, name)
        except NotFound:
            raise NotFound(f"Path {guest} not found") from None

    @staticmethod
    def _entry(guest: str, st: os.stat_result, fd: int, name: str) -> dict[str, Any]:
        entry = {
            "name": posixpath.basename(guest) or "/",
            "type": _type(st.st_mode),
            "path": guest,
            "size": st.st_size,
            "mode": stat.S_IMODE(st.st_mode),
            "uid": st.st_uid,
            "gid": st.st_gid,
            "atime": _time(st.st_atime),
            "mtime": _time(st.st_mtime),
            "ctime": _time(st.st_ctime),
        }
        if stat.S_ISLNK(st.st_mode):
            entry["target"] = os.readlink(name, dir_fd=fd)
        return entry

    def list_dir(self, path: str, depth: int = 1) -> list[dict[str, Any]]:
        if depth < 1:
            raise InvalidInput("depth must be at least 1")
        guest = self.normalize(path)
        with self._root_fd() as root:
            fd = self._open(root, guest, os.O_RDONLY | os.O_DIRECTORY)
            try:
                return list(self._walk(fd, guest, depth))
            finally:
                os.close(fd)

    def _walk(self, fd: int, directory: str, depth: int) -> Iterator[dict[str, Any]]:
        for name in sorted(os.listdir(fd)):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed by a guest meanwhile
            entry = self._entry(posixpath.join(directory, name), st, fd, name)
            yield entry
            if depth > 1 and stat.S_ISDIR(st.st_mode):
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    child = os.open(name, flags, dir_fd=fd)
                except OSError:
                    continue  # replaced by a guest meanwhile
                try:
                    yield from self._walk(child, entry["path"], depth - 1)
                finally:
                    os.close(child)

    def make_dir(
        self, path: str, uid: int | None, gid: int | None, mode: int | None, force: bool
    ) -> dict[str, Any]:
        """A directory; `force` makes its parents too and takes one that exists."""
        guest = self.normalize(path)
        parent = posixpath.dirname(guest)
        try:
            with self._at(guest) as (fd, name):
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    if force and stat.S_ISDIR(self._lstat_at(fd, name, guest).st_mode):
                        return self.stat(guest)
                    raise Conflict(f"Path {guest} already exists") from None
                self._own(fd, name, uid, gid, DEFAULT_DIR_MODE if mode is None else mode)
        except NotFound:
            if not force or self._exists(parent):
                raise
            self.make_dir(parent, uid, gid, mode, force)
            return self.make_dir(guest, uid, gid, mode, force)
        return self.stat(guest)

    def _exists(self, guest: str) -> bool:
        try:
            self.stat(guest)
        except NotFound:
            return False
        return True

    async def write_file(
        self,
        path: str,
        body: AsyncIterator[bytes],
        limit: int,
        uid: int | None,
        gid: int | None,
        mode: int | None,
        force: bool,
    ) -> dict[str, Any]:
        """A file from `body` (at most `limit` bytes), put in place whole once written;
        an existing file is replaced only with `force`."""
        guest = self.normalize(path)
        with self._at(guest) as (fd, name):
            with contextlib.suppress(NotFound):
                if stat.S_ISDIR(self._lstat_at(fd, name, guest).st_mode):
                    raise Conflict(f"Path {guest} is a directory")
                if not force:
                    raise Conflict(f"Path {guest} already exists")
            spool_fd, spool = tempfile.mkstemp(dir=self._spool)
            try:
                size = 0
                with os.fdopen(spool_fd, "wb") as out:
                    async for chunk in body:
                        size += len(chunk)
                        if size > limit:
                            raise TooLarge(f"a volume file may have at most {limit} bytes")
                        await asyncio.to_thread(out.write, chunk)
                    os.fchown(out.fileno(), uid or 0, gid or 0)
                    os.fchmod(out.fileno(), DEFAULT_FILE_MODE if mode is None else mode)
                try:
                    os.replace(spool, name, dst_dir_fd=fd)
                except IsADirectoryError:
                    raise Conflict(f"Path {guest} is a directory") from None
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(spool)
                raise
        return self.stat(guest)

    def read_file(self, path: str) -> Iterator[bytes]:
        """The file's bytes in chunks (NotFound unless it is a regular file)."""
        guest = self.normalize(path)
        with self._root_fd() as root:
            found = self._open(root, guest, os.O_PATH)
            try:
                # Checked before it is opened for reading: opening a device or a FIFO a
                # guest made could act on the node.
                if not stat.S_ISREG(os.fstat(found).st_mode):
                    raise NotFound(f"Path {guest} not found")
                handle = open(f"/proc/self/fd/{found}", "rb")
            finally:
                os.close(found)

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(CHUNK):
                    yield chunk

        return chunks()

    def update(self, path: str, uid: int | None, gid: int | None, mode: int | None) -> dict:
        guest = self.normalize(path)
        with self._at(guest) as (fd, name):
            st = self._lstat_at(fd, name, guest)
            if uid is not None or gid is not None:
                os.chown(
                    name,
                    st.st_uid if uid is None else uid,
                    st.st_gid if gid is None else gid,
                    dir_fd=fd,
                    follow_symlinks=False,
                )
            if mode is not None and not stat.S_ISLNK(st.st_mode):
                os.chmod(name, mode, dir_fd=fd, follow_symlinks=False)
        return self.stat(guest)

    def remove(self, path: str) -> None:
        guest = self.normalize(path)
        if guest == "/":
            raise NotFound("Path / not found")
        with self._at(guest) as (fd, name):
            if stat.S_ISDIR(self._lstat_at(fd, name, guest).st_mode):
                shutil.rmtree(name, dir_fd=fd)
            else:
                os.unlink(name, dir_fd=fd)

    def destroy(self) -> None:
        """The volume's directory, gone (rmtree does not follow symlinks)."""
        shutil.rmtree(self._root, ignore_errors=True)

    @staticmethod
    def _own(fd: int, name: str, uid: int | None, gid: int | None, mode: int) -> None:
        os.chown(name, uid or 0, gid or 0, dir_fd=fd, follow_symlinks=False)
        os.chmod(name, mode, dir_fd=fd, follow_symlinks=False)
