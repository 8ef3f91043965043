"""Users and groups of the user's root filesystem, read from its own /etc/passwd and /etc/group.

The agent runs chrooted into the runtime disk, so the ``pwd``/``grp`` modules would read the
wrong database; we parse the rootfs files ourselves and re-read them when they change.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class User:
    """One passwd entry plus its supplementary group ids."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str = "/bin/sh"
    groups: tuple[int, ...] = ()

    def base_env(self) -> dict[str, str]:
        """The environment every process of this user starts from."""
        return {"PATH": DEFAULT_PATH, "HOME": self.home, "USER": self.name, "LOGNAME": self.name}


ROOT = User("root", 0, 0, "/root", "/bin/sh", (0,))


@dataclass
class _Table:
    stamp: tuple[int, int] | None = None
    rows: list[list[str]] = field(default_factory=list)


class UserDB:
    """Lookups in ``<rootfs>/etc/passwd`` and ``<rootfs>/etc/group``, cached by mtime."""

    def __init__(self, rootfs: str) -> None:
        self._passwd_path = os.path.join(rootfs, "etc/passwd")
        self._group_path = os.path.join(rootfs, "etc/group")
        self._tables: dict[str, _Table] = {}

    def _rows(self, path: str, width: int) -> list[list[str]]:
        table = self._tables.setdefault(path, _Table())
        try:
            st = os.stat(path)
        except OSError:
            return []
        stamp = (st.st_mtime_ns, st.st_size)
        if table.stamp != stamp:
            rows = []
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    parts = line.rstrip("\n").split(":")
                    if len(parts) >= width and not line.startswith("#"):
                        rows.append(parts)
            table.stamp, table.rows = stamp, rows
        return table.rows

    def lookup(self, name: str) -> User | None:
        """The user called ``name`` (or with that numeric uid), or None."""
        for row in self._rows(self._passwd_path, 7):
            if row[0] == name or (name.isdigit() and row[2] == name):
                try:
                    uid, gid = int(row[2]), int(row[3])
                except ValueError:
                    continue
                groups = [gid]
                for grow in self._rows(self._group_path, 4):
                    if row[0] in grow[3].split(",") and grow[2].isdigit():
                        groups.append(int(grow[2]))
                return User(row[0], uid, gid, row[5] or "/", row[6], tuple(dict.fromkeys(groups)))
        if name == "root":
            return ROOT
        return None

    def user_name(self, uid: int) -> str:
        for row in self._rows(self._passwd_path, 7):
            if row[2] == str(uid):
                return row[0]
        return str(uid)

    def group_name(self, gid: int) -> str:
        for row in self._rows(self._group_path, 4):
            if row[2] == str(gid):
                return row[0]
        return str(gid)

    def default_user(self) -> User:
        """``user`` when the rootfs has one (E2B templates do), else root."""
        return self.lookup("user") or self.lookup("root") or ROOT


def basic_auth_user(header: str | None) -> str | None:
    """The user name of ``Authorization: Basic base64("user:")``, or None."""
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    name = decoded.split(":", 1)[0]
    return name or None
