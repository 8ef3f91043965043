"""What the daemon and its clients share: file locations, names and the config hand-over."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv.config import Config

log = logging.getLogger(__name__)

# Names become file names (`<name>.img`); layer ids become object keys.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
LAYER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# One request or answer per line; a status listing thousands of mounts stays far below.
MAX_LINE = 16 * 1024 * 1024


@dataclass(frozen=True)
class BlockdPaths:
    """Everything the daemon keeps under `<home>/blockd`."""

    root: Path

    @classmethod
    def for_home(cls, home: Path | str) -> BlockdPaths:
        return cls(Path(home).absolute() / "blockd")

    @property
    def mnt(self) -> Path:
        return self.root / "mnt"

    @property
    def socket(self) -> Path:
        return self.root / "control.sock"

    @property
    def mounts(self) -> Path:
        return self.root / "mounts.json"

    @property
    def log(self) -> Path:
        return self.root / "daemon.log"

    @property
    def config(self) -> Path:
        """The configuration the client handed over when it spawned the daemon."""
        return self.root / "config.json"

    @property
    def daemon_lock(self) -> Path:
        """Held by the running daemon for its whole life: one daemon per home."""
        return self.root / "daemon.lock"

    @property
    def spawn_lock(self) -> Path:
        """Held by a client while it checks for and starts a daemon."""
        return self.root / "spawn.lock"

    @property
    def indexes(self) -> Path:
        """Local copies of layer indexes (immutable), so a restart needs no store round trip."""
        return self.root / "indexes"

    def image(self, name: str) -> Path:
        return self.mnt / f"{name}.img"


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Readers see the old file or the new one, also after a crash."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def config_to_json(cfg: Config) -> bytes:
    return json.dumps(dataclasses.asdict(cfg), indent=1).encode()


def config_from_json(data: bytes) -> Config:
    """Inverse of `config_to_json`; unknown keys are ignored so versions may differ."""
    doc: dict[str, Any] = json.loads(data)
    cfg = Config()
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        known = {g.name for g in dataclasses.fields(section)}
        for key, value in doc.get(f.name, {}).items():
            if key in known:
                setattr(section, key, value)
    return cfg


def mount_device(path: Path) -> str | None:
    """`major:minor` of what is mounted exactly at `path` (topmost), or None."""
    # The mount point itself may be a dead FUSE mount that cannot be stat()ed, and a live
    # one that is not served yet would block a stat(): read the kernel's table instead.
    target = os.path.join(os.path.realpath(path.parent), path.name)
    device = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if fields[4].encode().decode("unicode_escape") == target:
                    device = fields[2]
    except OSError:
        return None
    return device


def is_mounted(path: Path) -> bool:
    return mount_device(path) is not None


def cleanup_stale_mount(mnt: Path) -> None:
    """Detach whatever (usually a crashed daemon's dead FUSE) is mounted at `mnt`."""
    for _ in range(8):  # mounts may be stacked
        if not is_mounted(mnt):
            return
        log.warning("detaching stale mount at %s", mnt)
        for cmd in (["umount", "-l", str(mnt)], ["fusermount3", "-u", "-z", str(mnt)]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0:
                    break
    if is_mounted(mnt):
        raise RuntimeError(f"cannot detach the stale mount at {mnt}")
