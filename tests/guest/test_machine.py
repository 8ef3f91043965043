"""The agent's VM duties that can run on the host: reading disk labels."""

from __future__ import annotations

import subprocess
from pathlib import Path

from agentenv.guest.agent.machine import ROOTFS_LABEL, ext4_label


def test_ext4_label_reads_the_superblock(tmp_path: Path) -> None:
    disk = tmp_path / "disk.ext4"
    with open(disk, "wb") as fh:
        fh.truncate(8 * 2**20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", ROOTFS_LABEL, str(disk)], check=True)
    assert ext4_label(str(disk)) == ROOTFS_LABEL


def test_no_label_on_a_blank_or_missing_disk(tmp_path: Path) -> None:
    blank = tmp_path / "blank"
    blank.write_bytes(bytes(8192))
    assert ext4_label(str(blank)) is None
    assert ext4_label(str(tmp_path / "missing")) is None
