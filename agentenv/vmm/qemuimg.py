"""The image files VMs use: qcow2 disks (made with `qemu-img`) and sparse copies of
disks and RAM files."""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
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


def set_backing(path: Path, backing: Path, backing_format: str) -> None:
    """Blocking: point the qcow2 overlay `path` at `backing` without touching its data
    (`rebase -u`): the same template image has another path on another node."""
    argv = ["qemu-img", "rebase", "-u", "-f", "qcow2", "-F", backing_format, "-b", str(backing)]
    proc = subprocess.run([*argv, str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VmmError(f"qemu-img rebase {path.name} failed: {proc.stderr.strip()}")


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
            try:
                _copy_range(fin.fileno(), fout.fileno(), start, end)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                # From a FUSE file (served RAM): no in-kernel copy, and no holes to seek.
                _write_nonzero(fin.fileno(), fout.fileno(), start, end)
            pos = end


def _copy_range(fin: int, fout: int, start: int, end: int) -> None:
    while start < end:
        copied = os.copy_file_range(fin, fout, end - start, start, start)
        if copied == 0:
            return
        start += copied


# Read in windows this big; zero pages in them are left holes.
_WINDOW = 1 << 20
_PAGE = 4096
_ZERO_PAGE = bytes(_PAGE)


def _write_nonzero(fin: int, fout: int, start: int, end: int) -> None:
    """Copy [start, end) by reading it, writing only the pages that are not all zeros."""
    while start < end:
        data = os.pread(fin, min(_WINDOW, end - start), start)
        if not data:
            return
        view = memoryview(data)
        run = None  # where the current run of non-zero pages began
        for at in range(0, len(data), _PAGE):
            zero = view[at : at + _PAGE] == _ZERO_PAGE[: len(data) - at]
            if zero and run is not None:
                os.pwrite(fout, view[run:at], start + run)
                run = None
            elif not zero and run is None:
                run = at
        if run is not None:
            os.pwrite(fout, view[run:], start + run)
        start += len(data)


def qcow2_virtual_size(path: Path) -> int:
    """The disk size a guest sees, from the qcow2 header (magic, then the size at byte 24)."""
    with open(path, "rb") as f:
        header = f.read(32)
    if len(header) < 32 or header[:4] != b"QFI\xfb":
        raise VmmError(f"{path.name} is not a qcow2 image")
    return int.from_bytes(header[24:32], "big")
