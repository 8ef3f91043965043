"""qcow2 overlays with the real `qemu-img`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agentenv.vmm.driver import VmmError
from agentenv.vmm.qemuimg import create_qcow2, set_backing


def _backing(path: Path) -> str:
    info = subprocess.run(
        ["qemu-img", "info", "--output=json", "-U", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(info.stdout)["backing-filename"]


async def test_an_overlay_is_pointed_at_its_template_elsewhere(tmp_path: Path) -> None:
    there, here = tmp_path / "there.img", tmp_path / "here.img"
    there.write_bytes(bytes(1 << 20))
    overlay = tmp_path / "rootfs.qcow2"
    await create_qcow2(overlay, 1 << 20, backing=there, backing_format="raw")
    there.rename(here)  # another node: the same image under another path
    set_backing(overlay, here, "raw")
    assert _backing(overlay) == str(here)
    with pytest.raises(VmmError, match="rebase"):
        set_backing(tmp_path / "missing.qcow2", here, "raw")
