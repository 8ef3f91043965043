"""Clones of one snapshot map its RAM privately: its clean pages exist once on the host,
what a guest writes or frees never reaches the snapshot, and a clone pauses to the pages
it wrote."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from agentenv.vmm import guestram

from ..live import LiveServer, boot_snapshot, vmm_pid, wait_for
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import kill, run

pytestmark = pytest.mark.vm

MIB = 1024 * 1024


def _rollup(pid: int) -> dict[str, int]:
    """The VMM's smaps_rollup figures, in bytes."""
    figures = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        figures[name.rstrip(":")] = int(value) * 1024
    return figures


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            digest.update(chunk)
    return digest.hexdigest()


def _snapshot_ram(server: LiveServer) -> Path:
    assert wait_for(lambda: boot_snapshot(server, 256) is not None, 180)
    snapshot = boot_snapshot(server, 256)
    assert snapshot is not None
    return snapshot / "memory"


def test_clones_map_the_snapshots_ram_and_share_its_clean_pages(
    server: LiveServer, vms: VmFactory
) -> None:
    snapshot_ram = _snapshot_ram(server)
    clones = [vms.create(server), vms.create(server)]
    pids = []
    for clone in clones:
        workdir = server.home / "sandboxes" / clone["sandboxID"]
        assert run(server, clone, "echo up")[0] == "up\n"
        pid = vmm_pid(server, clone["sandboxID"])
        assert pid is not None
        assert b"share=off" in Path(f"/proc/{pid}/cmdline").read_bytes()
        # The very file of the snapshot, linked, not a copy.
        assert (workdir / guestram.BASE).stat().st_ino == snapshot_ram.stat().st_ino
        assert not (workdir / guestram.OWN).exists()
        pids.append(pid)
    rollups = [_rollup(pid) for pid in pids]
    # Pages both map are counted half to each: the pair holds less than their sum.
    shared = sum(r["Rss"] for r in rollups) - sum(r["Pss"] for r in rollups)
    assert shared > 16 * MIB, rollups


def test_what_a_clone_writes_or_frees_never_reaches_the_snapshot(
    server: LiveServer, vms: VmFactory
) -> None:
    snapshot_ram = _snapshot_ram(server)
    before = _digest(snapshot_ram)
    clone = vms.create(server)
    vmm_log = server.home / "sandboxes" / clone["sandboxID"] / "vmm.log"
    # Fill most of the guest's free memory with fresh data, then free it: the guest's
    # balloon reports the free pages and QEMU discards them, punching holes into the
    # file it maps (QEMU warns it does). `privram` holds the file read-only and makes
    # the punch a no-op: only the clone's private copies go.
    fill = "python3 -c 'import os; b = os.urandom(120 << 20); print(len(b))'"
    assert run(server, clone, fill)[0] == f"{120 << 20}\n"
    assert wait_for(lambda: "private file mappings" in vmm_log.read_text(), 60)
    assert "readonly files" not in vmm_log.read_text()
    assert _digest(snapshot_ram) == before
    # And a new clone still starts from it intact.
    second = vms.create(server)
    assert run(server, second, "echo fine")[0] == "fine\n"
    # Nor does a clone's end.
    for each in (second, clone):
        kill(server, each["sandboxID"])
    assert _digest(snapshot_ram) == before


def test_a_clone_pauses_to_the_pages_it_wrote(server: LiveServer, vms: VmFactory) -> None:
    clone = vms.create(server)
    sid = clone["sandboxID"]
    workdir = server.home / "sandboxes" / sid
    write = "head -c 8M /dev/urandom > /dev/shm/data; sha256sum < /dev/shm/data"
    digest = run(server, clone, write)[0]
    with server.client() as api:
        assert api.post(f"/sandboxes/{sid}/pause", json={}).status_code == 204
        delta = workdir / "snapshot" / guestram.DELTA
        assert 8 * MIB < delta.stat().st_size < 128 * MIB
        assert not (workdir / guestram.OWN).exists()
        assert api.post(f"/sandboxes/{sid}/connect", json={"timeout": 60}).status_code == 201
    assert run(server, clone, "sha256sum < /dev/shm/data")[0] == digest
    assert os.stat(workdir / guestram.BASE).st_nlink >= 2
