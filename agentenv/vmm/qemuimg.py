"""The image files VMs use: qcow2 disks (made with `qemu-img`) and sparse copies of
disks and RAM files."""

from __future__ import annotations

import asyncio
import os
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


def copy_sparse(src: Path, dest: Path) -> None:
    """Copy `src` to `dest` leaving holes as holes (guest RAM files are mostly holes)."""
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        fout.truncate(size)
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fin.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fin.fileno(), start, os.SEEK_HOLE)
            while start < end:
                copied = os.copy_file_range(fin.fileno(), fout.fileno(), end - start, start, start)
                if copied == 0:
                    break
                start += copied
            pos = end


def qcow2_virtual_size(path: Path) -> int:
    """The disk size a guest sees, from the qcow2 header (magic, then the size at byte 24)."""
    with open(path, "rb") as f:
        header = f.read(32)
    if len(header) < 32 or header[:4] != b"QFI\xfb":
        raise VmmError(f"{path.name} is not a qcow2 image")
    return int.from_bytes(header[24:32], "big")
