"""A volume's files on this node, as E2B's volume content API serves them.

Paths are resolved inside the volume's directory as a chroot would (`..` stops at its
root, symlinks restart there), so no request reaches a file outside it. The content API
itself makes no symlinks; guests that mount a volume will, and then resolution has to
hold against a racing guest too (openat2's RESOLVE_IN_ROOT).
"""

from __future__ import annotations

import asyncio
import contextlib
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
from ..guest.agent.rootfs import RootFS

DEFAULT_FILE_MODE = 0o644
DEFAULT_DIR_MODE = 0o755
CHUNK = 256 * 1024


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
        self._root = RootFS(str(root))
        # Uploads are written here, then renamed into place (one file system): a crash
        # mid-upload leaves nothing in the volume, and the node clears this at start.
        self._spool = spool

    @staticmethod
    def normalize(path: str) -> str:
        """A client's path as an absolute one inside the volume."""
        return posixpath.normpath("/" + path.strip().lstrip("/"))

    def _host(self, path: str, follow: bool = False) -> str:
        return self._root.host(self.normalize(path), follow=follow)

    def _lstat(self, path: str) -> os.stat_result:
        try:
            return os.lstat(self._host(path))
        except FileNotFoundError:
            raise NotFound(f"Path {self.normalize(path)} not found") from None
        except NotADirectoryError:
            raise NotFound(f"Path {self.normalize(path)} not found") from None

    def stat(self, path: str) -> dict[str, Any]:
        st = self._lstat(path)
        guest = self.normalize(path)
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
            entry["target"] = os.readlink(self._host(path))
        return entry

    def list_dir(self, path: str, depth: int = 1) -> list[dict[str, Any]]:
        if depth < 1:
            raise InvalidInput("depth must be at least 1")
        if not stat.S_ISDIR(self._lstat(path).st_mode):
            raise NotFound(f"Path {self.normalize(path)} not found")
        return list(self._walk(self.normalize(path), depth))

    def _walk(self, directory: str, depth: int) -> Iterator[dict[str, Any]]:
        for name in sorted(os.listdir(self._host(directory))):
            child = posixpath.join(directory, name)
            entry = self.stat(child)
            yield entry
            if depth > 1 and entry["type"] == "directory":
                yield from self._walk(child, depth - 1)

    def make_dir(
        self, path: str, uid: int | None, gid: int | None, mode: int | None, force: bool
    ) -> dict[str, Any]:
        """A directory; `force` makes its parents too and takes one that exists."""
        guest = self.normalize(path)
        host = self._host(guest)
        if os.path.lexists(host):
            if not force or not os.path.isdir(host):
                raise Conflict(f"Path {guest} already exists")
            return self.stat(guest)
        parent = posixpath.dirname(guest)
        if not os.path.isdir(self._host(parent)):
            if not force or os.path.lexists(self._host(parent)):
                raise NotFound(f"Path {parent} not found")
            self.make_dir(parent, uid, gid, mode, force)
        os.mkdir(host)
        self._own(host, uid, gid, DEFAULT_DIR_MODE if mode is None else mode)
        return self.stat(guest)

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
        host = self._host(guest)
        if os.path.isdir(host):
            raise Conflict(f"Path {guest} is a directory")
        if os.path.lexists(host) and not force:
            raise Conflict(f"Path {guest} already exists")
        parent = os.path.dirname(host)
        if not os.path.isdir(parent):
            raise NotFound(f"Path {posixpath.dirname(guest)} not found")
        fd, spool = tempfile.mkstemp(dir=self._spool)
        try:
            size = 0
            with os.fdopen(fd, "wb") as out:
                async for chunk in body:
                    size += len(chunk)
                    if size > limit:
                        raise TooLarge(f"a volume file may have at most {limit} bytes")
                    await asyncio.to_thread(out.write, chunk)
            self._own(spool, uid, gid, DEFAULT_FILE_MODE if mode is None else mode)
            os.replace(spool, host)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(spool)
            raise
        return self.stat(guest)

    def read_file(self, path: str) -> Iterator[bytes]:
        """The file's bytes in chunks (NotFound unless it is a regular file)."""
        guest = self.normalize(path)
        if not stat.S_ISREG(self._lstat(guest).st_mode):
            raise NotFound(f"Path {guest} not found")
        handle = open(self._host(guest), "rb")

        def chunks() -> Iterator[bytes]:
            with handle:
                while chunk := handle.read(CHUNK):
                    yield chunk

        return chunks()

    def update(self, path: str, uid: int | None, gid: int | None, mode: int | None) -> dict:
        st = self._lstat(path)
        host = self._host(path)
        if uid is not None or gid is not None:
            os.lchown(host, st.st_uid if uid is None else uid, st.st_gid if gid is None else gid)
        if mode is not None and not stat.S_ISLNK(st.st_mode):
            os.chmod(host, mode)
        return self.stat(path)

    def remove(self, path: str) -> None:
        guest = self.normalize(path)
        if guest == "/":
            raise NotFound("Path / not found")
        st = self._lstat(guest)
        host = self._host(guest)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(host)
        else:
            os.unlink(host)

    def destroy(self) -> None:
        """The volume's directory, gone."""
        shutil.rmtree(self._root.root, ignore_errors=True)

    @staticmethod
    def _own(host: str, uid: int | None, gid: int | None, mode: int) -> None:
        os.lchown(host, uid or 0, gid or 0)
        os.chmod(host, mode)
