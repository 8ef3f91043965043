"""Mapping guest paths to host paths under the user's root filesystem.

Paths are resolved component by component as the kernel would inside a chroot: ``..``
stops at the root and absolute symlink targets restart at the root, so nothing escapes it.
A concurrent symlink swap between resolve and use could still race (no openat2 in the
stdlib); the VM is the security boundary, so this only needs to be correct, not hardened.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from .users import User

MAX_SYMLINKS = 40


class RootFS:
    """The user's root filesystem as seen from the agent."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)

    @property
    def is_host_root(self) -> bool:
        return self.root == "/"

    def guest_path(self, path: str, user: User) -> str:
        """Normalise a client path: ``~`` and relative paths are taken from the user's home."""
        if path in ("", "~"):
            path = user.home
        elif path.startswith("~/"):
            path = posixpath.join(user.home, path[2:])
        elif not path.startswith("/"):
            path = posixpath.join(user.home, path)
        return posixpath.normpath(path).replace("//", "/")

    def host(self, guest: str, *, follow: bool = True) -> str:
        """The host path of an absolute guest path; ``follow`` resolves a final symlink too."""
        if self.is_host_root:
            guest = posixpath.normpath(guest or "/")
            if follow:
                return os.path.realpath(guest)
            head, tail = posixpath.split(guest)
            return posixpath.join(os.path.realpath(head), tail)
        todo = [c for c in guest.split("/") if c]
        todo.reverse()
        done: list[str] = []
        links = 0
        missing = False
        while todo:
            comp = todo.pop()
            if comp == ".":
                continue
            if comp == "..":
                if done:
                    done.pop()
                continue
            if missing or (not todo and not follow):
                done.append(comp)
                continue
            try:
                st = os.lstat(os.path.join(self.root, *done, comp))
            except OSError:
                # Missing (or under a non-directory): the rest is taken literally, for creation.
                missing = True
                done.append(comp)
                continue
            if not stat.S_ISLNK(st.st_mode):
                done.append(comp)
                continue
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", guest)
            target = os.readlink(os.path.join(self.root, *done, comp))
            if target.startswith("/"):
                done = []
            todo.extend(reversed([c for c in target.split("/") if c]))
        return os.path.join(self.root, *done) if done else self.root

    def to_guest(self, host: str) -> str:
        """Inverse of :meth:`host` for a host path inside the root."""
        if self.is_host_root:
            return host
        rel = os.path.relpath(host, self.root)
        return "/" if rel == "." else "/" + rel

    def realpath(self, guest: str) -> str:
        """The fully resolved guest path (what a symlink finally points at)."""
        return self.to_guest(self.host(guest, follow=True))

    def makedirs(self, host_dir: str, user: User) -> None:
        """``mkdir -p`` that gives every directory it creates to ``user``."""
        missing = []
        path = host_dir
        while not os.path.isdir(path):
            missing.append(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        for path in reversed(missing):
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                if not os.path.isdir(path):
                    raise NotADirectoryError(
                        errno.ENOTDIR, "not a directory", self.to_guest(path)
                    ) from None
                continue
            chown(path, user)


def chown(host: str, user: User) -> None:
    """Give a freshly created path to the requesting user (no-op when not running as root)."""
    if os.geteuid() == 0:
        os.lchown(host, user.uid, user.gid)
