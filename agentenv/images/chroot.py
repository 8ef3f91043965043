"""Commands run inside a root tree being built, with /proc, /sys and /dev mounted for them.

The mounts are taken down on every path out (a failed step included), so no build leaves
host filesystems mounted inside a tree that is later deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from agentenv.guest.buildutil import KitBuildError, mounts_under, run

# What package scripts and pip need of a running system, and how each is mounted.
_MOUNTS: tuple[tuple[str, list[str]], ...] = (
    ("proc", ["-t", "proc", "proc"]),
    ("sys", ["-t", "sysfs", "sysfs"]),
    ("dev", ["--rbind", "/dev"]),
)
_PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy")
# A clean environment: the host's variables (a venv's PATH, say) must not leak in.
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "DEBIAN_FRONTEND": "noninteractive",
}


# The host's trust store: a host behind a TLS-inspecting proxy trusts its CA there, and
# downloads inside the tree must too.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TREE_CA_BUNDLE = "/tmp/aenv-host-ca.crt"


class Chroot:
    """A tree with its mounts in place (`mounted`); `run` executes a command inside it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def run(
        self,
        step: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        timeout: float = 3600,
    ) -> str:
        """Run `argv` in the tree as root; its stdout. KitBuildError names `step` on failure."""
        return run(
            step,
            ["chroot", self.root, *argv],
            env={**CHROOT_ENV, **(env or {})},
            timeout=timeout,
        )

    def download_env(self) -> dict[str, str]:
        """Variables that make pip (and requests, and OpenSSL) inside the tree trust what
        the host trusts, and use the host's proxy if it has one."""
        env = {k: v for k, v in os.environ.items() if k.lower() in _PROXY_VARS}
        if HOST_CA_BUNDLE.is_file():
            shutil.copyfile(HOST_CA_BUNDLE, self.root / TREE_CA_BUNDLE.lstrip("/"))
            env |= {"PIP_CERT": TREE_CA_BUNDLE, "SSL_CERT_FILE": TREE_CA_BUNDLE}
        return env

    def bind(self, source: Path, target: str) -> None:
        """Mount host directory `source` at `target` in the tree until `mounted` ends."""
        inside = self.root / target.lstrip("/")
        inside.mkdir(parents=True, exist_ok=True)
        source.mkdir(parents=True, exist_ok=True)
        run(f"bind {target}", ["mount", "--bind", source, inside])


@contextlib.contextmanager
def mounted(root: Path) -> Iterator[Chroot]:
    """`root` with /proc, /sys, /dev and the host's resolver, all removed again on exit."""
    resolv = root / "etc/resolv.conf"
    saved = resolv.read_bytes() if resolv.is_file() and not resolv.is_symlink() else None
    try:
        for name, how in _MOUNTS:
            (root / name).mkdir(exist_ok=True)
            run(f"mount /{name}", ["mount", *how, root / name])
        # Downloads inside the tree resolve names as the host does.
        resolv.unlink(missing_ok=True)
        shutil.copyfile("/etc/resolv.conf", resolv)
        yield Chroot(root)
    finally:
        unmount_all(root)
        resolv.unlink(missing_ok=True)
        if saved is not None:
            resolv.write_bytes(saved)


def unmount_all(root: Path) -> None:
    """Unmount everything at or below `root`, deepest first; raise if any stays."""
    for mnt in mounts_under(root):
        if subprocess.run(["umount", mnt], check=False, capture_output=True).returncode:
            # Busy (a daemon a package script left running): detach it instead.
            subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)
    left = mounts_under(root)
    if left:
        raise KitBuildError(f"chroot: still mounted under {root}: {', '.join(left)}")
