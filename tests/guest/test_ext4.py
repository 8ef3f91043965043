"""An ext4 image's filesystem size, read from its superblock."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agentenv.guest.ext4 import filesystem_bytes


@pytest.mark.parametrize("features", ["64bit", "^64bit"])
def test_the_filesystem_not_the_disk_is_measured(tmp_path: Path, features: str) -> None:
    disk = tmp_path / "disk.img"
    with disk.open("wb") as sparse:
        sparse.truncate(256 << 20)
    mkfs = ["mkfs.ext4", "-q", "-F", "-O", features, "-b", "4096", str(disk), "96M"]
    subprocess.run(mkfs, check=True, capture_output=True)
    assert filesystem_bytes(disk) == 96 << 20


def test_a_disk_without_ext4_has_no_size(tmp_path: Path) -> None:
    blank = tmp_path / "blank.img"
    blank.write_bytes(bytes(4096))
    assert filesystem_bytes(blank) is None
    (tmp_path / "short.img").write_bytes(bytes(100))
    assert filesystem_bytes(tmp_path / "short.img") is None
