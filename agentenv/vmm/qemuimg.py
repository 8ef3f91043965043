"""`qemu-img`: creating the qcow2 disks VMs write to."""

from __future__ import annotations

import asyncio
from pathlib import Path

from .driver import VmmError


async def create_qcow2(
    path: Path, size: int | None = None, *, backing: Path | None = None, backing_format: str = ""
) -> None:
    """A qcow2 image at `path`: empty, or a copy-on-write overlay of `backing`."""
    argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
    if backing is not None:
        argv += ["-F", backing_format, "-b", str(backing)]
    argv.append(str(path))
    if size is not None:
        argv.append(str(size))
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise VmmError(
            f"qemu-img create {path.name} failed: {err.decode(errors='replace').strip()}"
        )
