"""Guest RAM as files: a VM's own RAM file, or a snapshot's RAM file mapped privately with
the pages the guest wrote kept apart.

A VM restored from a snapshot maps the snapshot's RAM file copy-on-write
(`MAP_PRIVATE`), so the pages no clone wrote exist once in the host's page cache however
many clones run. The kernel tells which pages of such a mapping were written
(`/proc/PID/pagemap`: present or swapped, and no longer the file's page); a pause saves
those pages as a delta and a resume writes them back into the new VMM before its guest
runs. VMM-neutral: any VMM that maps guest RAM from a file can use it.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

from .qemuimg import copy_sparse

# In a VM's work directory: its own RAM file, or a hard link to the snapshot RAM it maps.
OWN = "memory"
BASE = "memory.base"
# In a saved state: the pages the guest wrote over BASE.
DELTA = "memory.delta"
# A whole RAM file made from BASE and DELTA for as long as something reads it.
WHOLE = "memory.whole"
# Every name above: a saved state's other files are device state.
RAM_FILES = frozenset({OWN, BASE, DELTA, WHOLE})

PAGE = 4096
_MAGIC = b"AENVPGS1"
# pagemap entry bits 63 (present), 62 (swapped) and 61 (file page or shared) are the top
# three of each entry's last byte (little-endian): written pages of a private file
# mapping are present or swapped and not the file's. Maps that byte to 1 for those.
_WRITTEN = bytes(1 if (byte >> 5) in (0b100, 0b010, 0b110) else 0 for byte in range(256))


class RamError(OSError):
    """Guest RAM could not be read from or written into a VMM process."""


def maps_base(workdir: Path) -> bool:
    """True when the VM of `workdir` maps a snapshot's RAM rather than owning a RAM file."""
    return not (workdir / OWN).exists() and (workdir / BASE).exists()


def holds_ram(workdir: Path, state_dir: Path) -> bool:
    """True when a paused VM's RAM is whole here: its own file, or base and delta."""
    return (workdir / OWN).is_file() or (
        (workdir / BASE).is_file() and (state_dir / DELTA).is_file()
    )


def drop(workdir: Path) -> None:
    """Forget a stopped VM's RAM files (its own or the link to a snapshot's)."""
    for name in (OWN, BASE):
        (workdir / name).unlink(missing_ok=True)


def link_base(snapshot_ram: Path, workdir: Path) -> bool:
    """Make `snapshot_ram` the base the VM of `workdir` maps; False when it cannot be
    linked (another file system), and the caller copies it instead. A base served from
    elsewhere (a symbolic link, see `serve_base`) is linked to the same place."""
    (workdir / BASE).unlink(missing_ok=True)
    try:
        if snapshot_ram.is_symlink():
            (workdir / BASE).symlink_to(os.readlink(snapshot_ram))
        else:
            os.link(snapshot_ram, workdir / BASE)
    except OSError:
        return False
    return True


def serve_base(served: Path, workdir: Path, state_dir: Path) -> None:
    """Make the read-only file `served` (RAM the block daemon serves from the object
    store, page by page as it is touched) the base of a saved state with no pages of its
    own: a symbolic link to it and an empty delta."""
    drop(workdir)
    (workdir / BASE).symlink_to(served)
    empty = _MAGIC + struct.pack(">Q", 0)
    (state_dir / DELTA).write_bytes(empty.ljust(_index_size(0), b"\0"))


def _mapping(pid: int, path: Path) -> tuple[int, int]:
    """The address range where process `pid` maps `path` (the file a link names)."""
    target = os.path.realpath(path)
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == target:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    return start, end
    except OSError as exc:
        raise RamError(f"reading the mappings of pid {pid}: {exc}") from exc
    raise RamError(f"pid {pid} does not map {target}")


def _runs(pages: list[int]) -> Iterator[tuple[int, int]]:
    """(first page, count) for each run of consecutive page numbers."""
    start = count = 0
    for page in pages:
        if count and page == start + count:
            count += 1
            continue
        if count:
            yield start, count
        start, count = page, 1
    if count:
        yield start, count


def written_pages(pid: int, base: Path) -> list[int]:
    """Page numbers (within `base`) that process `pid` wrote in its private mapping."""
    start, end = _mapping(pid, base)
    with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
        entries = os.pread(pagemap.fileno(), (end - start) // PAGE * 8, start // PAGE * 8)
    # One flag byte per page, then runs of written ones: C loops, not one per page.
    written = entries[7::8].translate(_WRITTEN)
    return [
        page for run in re.finditer(b"\x01+", written) for page in range(run.start(), run.end())
    ]


def _index_size(count: int) -> int:
    return -(-(16 + 4 * count) // PAGE) * PAGE


def save_delta(pid: int, base: Path, dest: Path) -> int:
    """Write the pages process `pid` wrote over `base` to `dest`; how many."""
    pages = written_pages(pid, base)
    start, _ = _mapping(pid, base)
    index = _MAGIC + struct.pack(f">Q{len(pages)}I", len(pages), *pages)
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem, open(dest, "wb") as out:
        out.write(index.ljust(_index_size(len(pages)), b"\0"))
        for first, count in _runs(pages):
            data = os.pread(mem.fileno(), count * PAGE, start + first * PAGE)
            if len(data) != count * PAGE:
                raise RamError(f"pid {pid}: short read of guest RAM")
            out.write(data)
    return len(pages)


def read_index(delta: Path) -> list[int]:
    """The page numbers a delta holds, in the order its pages follow the index."""
    with open(delta, "rb") as f:
        head = f.read(16)
        if len(head) != 16 or head[:8] != _MAGIC:
            raise RamError(f"{delta} is not a RAM delta")
        (count,) = struct.unpack(">Q", head[8:])
        return list(struct.unpack(f">{count}I", f.read(4 * count)))


def _delta_runs(delta: Path) -> Iterator[tuple[int, bytes]]:
    """(first page, data) for each run of consecutive pages in `delta`."""
    pages = read_index(delta)
    with open(delta, "rb") as f:
        f.seek(_index_size(len(pages)))
        for first, count in _runs(pages):
            data = f.read(count * PAGE)
            if len(data) != count * PAGE:
                raise RamError(f"{delta} is truncated")
            yield first, data


def load_delta(pid: int, base: Path, delta: Path) -> None:
    """Write a delta's pages into process `pid`'s private mapping of `base`."""
    start, end = _mapping(pid, base)
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
        for first, data in _delta_runs(delta):
            if start + first * PAGE + len(data) > end:
                raise RamError(f"{delta} reaches past the guest's RAM")
            os.pwrite(mem.fileno(), data, start + first * PAGE)


def materialize(base: Path, delta: Path, dest: Path) -> None:
    """One whole RAM file at `dest`: `base` with `delta`'s pages written over it."""
    copy_sparse(base, dest)
    with open(dest, "r+b") as out:
        for first, data in _delta_runs(delta):
            os.pwrite(out.fileno(), data, first * PAGE)


def keep(workdir: Path, state_dir: Path, dest: Path) -> None:
    """Give `dest` a stopped VM's RAM as a saved state holds it: a link to the base it
    maps (its delta is copied with the rest of `state_dir`), else a copy of its own file."""
    if maps_base(workdir) and link_base(workdir / BASE, dest):
        return
    copy_whole(workdir, state_dir, dest / OWN)


def copy_whole(workdir: Path, state_dir: Path, dest: Path) -> None:
    """Copy a paused (or stopped) VM's RAM to `dest` as one whole file."""
    if maps_base(workdir):
        materialize(workdir / BASE, state_dir / DELTA, dest)
    else:
        copy_sparse(workdir / OWN, dest)


@contextlib.contextmanager
def whole_file(workdir: Path, state_dir: Path) -> Iterator[Path]:
    """A paused VM's RAM as one file for as long as the block lasts: its own file, or a
    temporary one made from base and delta."""
    if not maps_base(workdir):
        yield workdir / OWN
        return
    temporary = workdir / WHOLE
    copy_whole(workdir, state_dir, temporary)
    try:
        yield temporary
    finally:
        temporary.unlink(missing_ok=True)
