"""Pack a directory tree into a sparse ext4 image with `mkfs.ext4 -d` (no loop mounts), and
read an image's filesystem size from its superblock."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from agentenv.guest.buildutil import KitBuildError, Progress, run, step

BLOCK = 4096
INODE_SIZE = 256
# The superblock: 1024 bytes in; its magic, block counts and block size's log.
SUPERBLOCK = 1024
MAGIC = 0xEF53


@dataclass(frozen=True)
class TreeUsage:
    """What a tree needs on ext4: data blocks (bytes) and inodes."""

    bytes: int
    inodes: int


def tree_usage(tree: Path) -> TreeUsage:
    """Bytes in whole 4 KiB blocks (hard links counted once) and the inode count of `tree`."""
    total = 0
    inodes = 0
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in (*dirnames, *filenames):
            st = os.lstat(os.path.join(dirpath, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            inodes += 1
            total += math.ceil(st.st_size / BLOCK) * BLOCK if st.st_size > 60 else 0
    return TreeUsage(bytes=total + BLOCK, inodes=inodes + 1)


def auto_size_mb(usage: TreeUsage, *, slack: float = 0.2) -> int:
    """Content plus inode tables plus `slack`, plus a small fixed reserve, in MiB."""
    need = usage.bytes + usage.inodes * 2 * INODE_SIZE
    return math.ceil(need * (1 + slack) / 2**20) + 16


def pack_ext4(
    tree: Path,
    image: Path,
    size_mb: int | None,
    label: str,
    progress: Progress,
    *,
    journal: bool = True,
) -> int:
    """Create `image` (sparse, `size_mb` or auto) holding `tree` as ext4 labelled `label`.

    Returns the image size in MiB.
    """
    usage = tree_usage(tree)
    size = size_mb or auto_size_mb(usage)
    features = "has_journal" if journal else "^has_journal"
    with step(progress, f"packing {image.name} (label {label})"):
        for attempt in range(3):
            try:
                _mkfs(tree, image, size, label, features, usage.inodes)
                break
            except KitBuildError:
                # An auto-sized image may come out a little small; grow it and try again.
                if size_mb is not None or attempt == 2:
                    raise
                size = math.ceil(size * 1.25)
        run(f"check {image.name}", ["e2fsck", "-fn", image])
    progress(f"{image.name}: {size} MiB, {usage.bytes / 2**20:.0f} MiB used")
    return size


def _mkfs(tree: Path, image: Path, size: int, label: str, features: str, used: int) -> None:
    image.unlink(missing_ok=True)
    with open(image, "wb") as fh:
        fh.truncate(size * 2**20)
    # Room for twice today's inodes, so a user disk can still grow in file count.
    inodes = max(used * 2, (size * 2**20) // 16384)
    argv: list[str | Path] = ["mkfs.ext4", "-q", "-F", "-L", label, "-d", tree, "-m", "0"]
    argv += ["-N", str(inodes)]
    # Inode tables are initialised now, or the guest's ext4lazyinit would write them into
    # every sandbox's overlay. The journal needs no zeroing: the file is new, its holes read 0.
    argv += ["-O", features, "-E", "lazy_itable_init=0,lazy_journal_init=1", image]
    run(f"mkfs.ext4 {image.name}", argv)


def filesystem_bytes(image: Path) -> int | None:
    """The size of the ext4 filesystem at the start of `image` (which may be a larger
    disk: a grown filesystem fills more of it), or None when there is none."""
    with image.open("rb") as disk:
        disk.seek(SUPERBLOCK)
        block = disk.read(1024)
    if len(block) < 1024 or int.from_bytes(block[56:58], "little") != MAGIC:
        return None
    count = int.from_bytes(block[4:8], "little")
    incompat_64bit = int.from_bytes(block[96:100], "little") & 0x80
    if incompat_64bit:
        count |= int.from_bytes(block[0x150:0x154], "little") << 32
    return count * (1024 << int.from_bytes(block[24:28], "little"))
