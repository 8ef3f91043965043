"""Stored RAM served by a real block daemon, and unmounted once nothing links to it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentenv.config import Config
from agentenv.runtime.snapshots.servedram import ServedRam
from agentenv.storage.blockd import BlockdClient
from agentenv.storage.filelayer import store_file
from agentenv.storage.posix import PosixObjectStore
from agentenv.vmm import guestram
from agentenv.vmm.qemuimg import copy_sparse

pytestmark = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fuse3",
)


@pytest.fixture
def home() -> Iterator[Path]:
    # Not tmp_path: the daemon's socket path must stay under the AF_UNIX limit.
    home = Path(tempfile.mkdtemp(prefix="ram-", dir="/tmp"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_served_ram_lives_while_a_link_names_it(home: Path) -> None:
    cfg = Config()
    cfg.paths.home = str(home)
    store = PosixObjectStore(cfg.objects_dir)
    client = BlockdClient(cfg, start_timeout=30)
    try:
        ram = home / "ram"
        ram.write_bytes(os.urandom(32 * 4096) + bytes(16 * 4096) + os.urandom(16 * 4096))
        layer, _ = store_file(store, ram, None, 4096)
        work = home / "sandboxes" / "s1"
        (work / "snapshot").mkdir(parents=True)
        served = ServedRam(client, store, [home / "sandboxes"])
        guestram.serve_base(served.serve(layer), work, work / "snapshot")
        assert (work / guestram.BASE).read_bytes() == ram.read_bytes()
        # A copy (an upload's whole RAM) reads it, with zero pages left holes.
        copy = home / "copy"
        copy_sparse(work / guestram.BASE, copy)
        assert copy.read_bytes() == ram.read_bytes()
        assert copy.stat().st_blocks * 512 < 64 * 4096
        for _ in range(3):
            assert served.sweep() == 0
        (work / guestram.BASE).unlink()
        assert served.sweep() == 0  # the first round only marks it
        # Served again before the next round: the count starts afresh.
        assert served.serve(layer).read_bytes() == ram.read_bytes()
        assert served.sweep() == 0
        assert served.sweep() == 1
        assert client.status()["mounts"] == []
    finally:
        client.stop()
