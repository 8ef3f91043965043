"""Shared helpers for the guest kit and image builders: errors, steps, locks, subprocesses."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

Progress = Callable[[str], None]


class KitBuildError(RuntimeError):
    """A build step failed; the message names the step."""


def run(
    step: str,
    argv: Sequence[str | os.PathLike[str]],
    *,
    error: type[Exception] = KitBuildError,
    **kwargs: Any,
) -> str:
    """Run a command, return its stdout; raise `error` naming `step` on failure."""
    try:
        proc = subprocess.run(
            [str(a) for a in argv], check=True, capture_output=True, text=True, **kwargs
        )
    except FileNotFoundError as exc:
        raise error(f"{step}: {argv[0]} not found (install it)") from exc
    except subprocess.CalledProcessError as exc:
        tail = "\n".join((exc.stderr or exc.stdout or "").strip().splitlines()[-15:])
        if "No space left" in tail:
            raise error(f"{step}: no space left on device ({tail})") from None
        cmd = " ".join(map(str, argv))
        raise error(f"{step}: {cmd} exited {exc.returncode}\n{tail}") from None
    return proc.stdout


@contextlib.contextmanager
def step(progress: Progress, name: str) -> Iterator[None]:
    """Report a named build step with its elapsed time."""
    t0 = time.monotonic()
    progress(f"{name} ...")
    yield
    progress(f"{name}: done in {time.monotonic() - t0:.1f}s")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive file lock so concurrent builders wait instead of racing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def hash_tree(h: hashlib._Hash, root: Path, label: str) -> None:
    """Feed every file under `root` (path and content, sorted, caches skipped) into `h`."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if "__pycache__" in rel.parts or path.suffix == ".pyc":
            continue
        h.update(f"{label}/{rel}\0".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path`, deepest first."""
    prefix = str(path.resolve())
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mnt = line.split()[4].encode().decode("unicode_escape")
            if mnt == prefix or mnt.startswith(prefix + "/"):
                found.append(mnt)
    return sorted(found, key=len, reverse=True)


def remove_tree(path: Path) -> None:
    """Delete a build tree, first unmounting anything a failed chroot step left inside it."""
    if not path.exists():
        return
    # rmtree through a leftover bind mount of /dev or /proc would damage the host.
    for mnt in mounts_under(path):
        subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)
    if mounts_under(path):
        raise KitBuildError(f"cleanup: {path} still has mounts; not deleting it")
    shutil.rmtree(path, ignore_errors=True)
