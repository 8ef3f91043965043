"""Lifecycle operations on fakes: every failure, kill and crash ends in a state the table
names, with nothing left behind."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentenv.errors import Conflict, Unavailable
from agentenv.images.snapshots import SnapshotRecord, SnapshotRegistry, new_name, new_tag
from agentenv.runtime.node.recovery import recover
from agentenv.runtime.node.sweeper import sweep_once
from agentenv.runtime.sandboxes.manager import GuestLost
from agentenv.runtime.sandboxes.routes import RouteTable
from agentenv.runtime.snapshots import persist
from agentenv.runtime.snapshots.named import SandboxSnapshots
from agentenv.runtime.snapshots.persist import SCAN_INTERVAL, Uploads
from agentenv.state.lifecycle import State
from agentenv.state.sandboxes import SandboxRecord
from agentenv.storage.objectstore import ObjectStoreError
from agentenv.vmm import guestram
from agentenv.vmm.driver import VmHandle, VmmError

from .fakes import Harness, make_harness


@pytest.fixture
async def h(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    harness = await make_harness(tmp_path, monkeypatch)
    yield harness
    await harness.manager.store.close()


def gone(h: Harness, sandbox_id: str) -> bool:
    workdir = h.manager.machines.workdir(sandbox_id)
    return not workdir.exists() and not h.driver.alive and not h.networks


async def test_create_that_fails_at_init_leaves_nothing(h: Harness) -> None:
    h.agent.init_error = Unavailable("the sandbox's guest did not answer /init: ReadTimeout")
    with pytest.raises(Unavailable, match="did not answer /init"):
        await h.create()
    assert await h.manager.store.list() == []
    assert not h.driver.alive and not h.networks
    assert list(h.manager.cfg.sandboxes_dir.iterdir()) == []


async def test_failed_pause_resumes_the_guest_and_keeps_it_running(h: Harness) -> None:
    sid = await h.create()
    h.driver.fail["pause"] = VmmError("migration failed")
    with pytest.raises(VmmError):
        await h.pauses.pause(sid)
    assert await h.state(sid) == "running"
    assert h.manager.routes.get(sid) is not None
    assert h.driver.alive and not h.driver.frozen


async def test_kill_cancels_a_stuck_pause(h: Harness) -> None:
    sid = await h.create()
    h.driver.gate["pause"] = asyncio.Event()  # never set: the VMM hangs
    pausing = asyncio.create_task(h.pauses.pause(sid))
    await asyncio.wait_for(h.driver.held_at("pause"), 5)
    assert await h.state(sid) == "pausing"
    await asyncio.wait_for(h.manager.kill(sid), 5)
    with pytest.raises(Conflict, match="killed"):
        await pausing
    assert await h.state(sid) is None
    assert gone(h, sid)


async def test_the_sweeper_leaves_a_vm_an_operation_stopped_on_purpose(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await h.create()
    # A sweep pass that read its leases before the pause began (a slow pass on a loaded
    # node) sees the VM gone once the pause has stopped it.
    stale = await h.manager.store.leases()

    async def leases() -> list:  # type: ignore[type-arg]
        return stale

    monkeypatch.setattr(h.manager.store, "leases", leases)
    h.driver.gate["pause"] = asyncio.Event()
    pausing = asyncio.create_task(h.pauses.pause(sid))
    await asyncio.wait_for(h.driver.held_at("pause"), 5)
    h.driver.alive.clear()
    await sweep_once(h.pauses)
    h.driver.gate["pause"].set()
    await asyncio.wait_for(pausing, 5)
    assert await h.state(sid) == "paused"
    await sweep_once(h.pauses)  # a paused sandbox keeps its last VM's handle: still paused
    assert await h.state(sid) == "paused"


async def test_the_sweeper_removes_a_running_sandbox_whose_vm_exited(h: Harness) -> None:
    sid = await h.create()
    h.driver.alive.clear()
    await sweep_once(h.pauses)
    assert await h.state(sid) is None
    assert gone(h, sid)


async def test_kill_cancels_a_create_under_way(h: Harness) -> None:
    h.driver.gate["boot"] = asyncio.Event()
    creating = asyncio.create_task(h.create())
    await asyncio.wait_for(h.driver.held_at("boot"), 5)
    (record,) = await h.manager.store.list()
    assert record.state == State.CREATING
    await asyncio.wait_for(h.manager.kill(record.sandbox_id), 5)
    with pytest.raises(Conflict):
        await creating
    assert await h.manager.store.list() == []
    assert gone(h, record.sandbox_id)


async def test_resume_refused_before_the_guest_ran_stays_paused(h: Harness) -> None:
    sid = await h.create()
    await h.pauses.pause(sid)
    h.driver.fail["load"] = VmmError("QEMU refused the state")
    with pytest.raises(Unavailable, match="could not be resumed"):
        await h.pauses.resume(sid, 60)
    assert await h.state(sid) == "paused"
    assert h.driver.saved_state_intact(h.manager.machines.snapshot_dir(sid))
    # Once the VMM is fine again, the very same state resumes.
    del h.driver.fail["load"]
    await h.pauses.resume(sid, 60)
    assert await h.state(sid) == "running"


async def test_resume_that_fails_after_the_guest_ran_kills_the_sandbox(h: Harness) -> None:
    sid = await h.create()
    await h.pauses.pause(sid)
    h.agent.init_error = Unavailable("the sandbox's guest did not answer /init: ReadTimeout")
    with pytest.raises(GuestLost):
        await h.pauses.resume(sid, 60)
    assert await h.state(sid) is None
    assert gone(h, sid)


async def test_concurrent_creates_are_admitted_one_at_a_time(h: Harness) -> None:
    h.manager.intake.capacity = type(h.manager.intake.capacity)(
        memory_mb=300, disk_mb=10**9, max_vcpus=4
    )
    results = await asyncio.gather(h.create(), h.create(), return_exceptions=True)
    assert sum(isinstance(r, str) for r in results) == 1
    assert sum(isinstance(r, Unavailable) for r in results) == 1


async def test_resume_is_admitted_like_a_create(h: Harness) -> None:
    h.manager.intake.capacity = type(h.manager.intake.capacity)(
        memory_mb=300, disk_mb=10**9, max_vcpus=4
    )
    first = await h.create()
    await h.pauses.pause(first)
    await h.create()
    with pytest.raises(Unavailable, match="not enough host memory"):
        await h.pauses.resume(first, 60)
    assert await h.state(first) == "paused"


# -- recovery: one rule per state ---------------------------------------------------------


async def crashed_in(h: Harness, state: State, *, saved: bool, alive: bool) -> str:
    """A sandbox as a dead server left it: `state`, its VM alive or not, its state saved."""
    sid = await h.create()
    record = await h.manager.store.get(sid)
    assert record is not None and record.vm is not None
    handle = VmHandle.from_dict(record.vm)
    snapshot = h.manager.machines.snapshot_dir(sid)
    if saved:
        snapshot.mkdir(exist_ok=True)
        (snapshot / "vmstate").write_text("device state")
    if alive:
        h.driver.frozen.add(handle.pid)
    else:
        await h.driver.stop(handle)
    await h.manager.store.update(sid, state=state)
    h.manager.routes = RouteTable()
    return sid


@pytest.mark.parametrize(
    ("state", "saved", "alive", "outcome", "runs"),
    [
        (State.CREATING, False, True, None, False),
        (State.RUNNING, False, True, "running", True),
        (State.RUNNING, False, False, None, False),
        (State.PAUSING, True, True, "paused", False),
        (State.PAUSING, False, True, "running", True),
        (State.PAUSING, False, False, None, False),
        (State.PAUSED, True, False, "paused", False),
        (State.PAUSED, False, False, None, False),
        (State.RESUMING, True, False, "paused", False),
        (State.RESUMING, False, True, "running", True),
        (State.RESUMING, False, False, None, False),
        (State.CHECKPOINTING, False, True, "running", True),
        (State.COPYING, True, False, "paused", False),
        (State.COPYING, False, False, None, False),
        (State.KILLING, False, True, None, False),
    ],
)
async def test_recovery_rule(
    h: Harness, state: State, saved: bool, alive: bool, outcome: str | None, runs: bool
) -> None:
    sid = await crashed_in(h, state, saved=saved, alive=alive)
    (h.manager.cfg.home / "forks" / "dead-checkpoint").mkdir(parents=True)
    report = await recover(h.manager)
    assert await h.state(sid) == outcome
    assert (h.manager.routes.get(sid) is not None) == runs
    # A sandbox that runs is continued; a paused one holds no VMM; a gone one holds nothing.
    assert bool(h.driver.alive) == runs and not h.driver.frozen
    if outcome is None:
        assert gone(h, sid) and report.removed == [sid]
    assert not list((h.manager.cfg.home / "forks").iterdir())


async def test_filesystem_pause_keeps_the_disk_and_restarts_a_fresh_guest(h: Harness) -> None:
    sid = await h.create()
    workdir = h.manager.machines.workdir(sid)
    await h.pauses.pause(sid, memory=False)
    record = await h.manager.store.get(sid)
    assert record is not None and (record.state, record.pause_mode) == ("paused", "filesystem")
    assert (workdir / "rootfs.qcow2").exists() and not (workdir / "memory").exists()
    assert not h.driver.alive
    inits = len(h.agent.inits)
    await h.pauses.resume(sid, 60)
    record = await h.manager.store.get(sid)
    assert record is not None and (record.state, record.pause_mode) == ("running", None)
    # A fresh guest was given the sandbox's environment again.
    assert len(h.agent.inits) == inits + 1 and len(h.driver.alive) == 1


async def test_filesystem_pause_needs_an_answering_agent(h: Harness) -> None:
    sid = await h.create()
    h.agent.init_error = Unavailable("the sandbox's guest did not answer /sync: ReadTimeout")
    with pytest.raises(Unavailable):
        await h.pauses.pause(sid, memory=False)
    assert await h.state(sid) == "running" and h.manager.routes.get(sid) is not None


async def test_recovery_of_a_filesystem_pause(h: Harness) -> None:
    """A filesystem pause that died with its guest still running lets it run on; one
    whose VM is gone is paused at its disk."""
    running = await crashed_in(h, State.PAUSING, saved=False, alive=True)
    stopped = await crashed_in(h, State.PAUSING, saved=False, alive=False)
    for sid in (running, stopped):
        await h.manager.store.update(sid, pause_mode="filesystem")
    await recover(h.manager)
    assert await h.state(running) == "running" and h.manager.routes.get(running) is not None
    assert await h.state(stopped) == "paused"


async def test_recovery_finishes_a_committed_rollback(h: Harness) -> None:
    """Staged files renamed into place are the commit: recovery stops the old VM, moves
    the snapshot's files in and leaves the sandbox paused at the snapshot."""
    sid = await crashed_in(h, State.ROLLING_BACK, saved=False, alive=True)
    workdir = h.manager.machines.workdir(sid)
    committed = workdir / "rollback"
    committed.mkdir()
    (committed / "memory").write_text("snapshot ram")
    (committed / "rootfs.qcow2").write_text("snapshot disk")
    (committed / "vmstate").write_text("device state")
    (committed / "rollback.json").write_text('{"memory": true, "kit": "kit1"}')
    await recover(h.manager)
    assert await h.state(sid) == "paused"
    assert not h.driver.alive
    assert (workdir / "memory").read_text() == "snapshot ram"
    assert (workdir / "rootfs.qcow2").read_text() == "snapshot disk"
    assert (h.manager.machines.snapshot_dir(sid) / "vmstate").read_text() == "device state"
    assert not committed.exists()


async def test_a_rollback_to_a_base_the_sandbox_already_maps_moves_it_out(h: Harness) -> None:
    """A clone rolled back to a snapshot of the same base: both are links of one file,
    and renaming one link over another does nothing, so the saved state must not keep it."""
    sid = await crashed_in(h, State.ROLLING_BACK, saved=False, alive=True)
    workdir = h.manager.machines.workdir(sid)
    (workdir / "memory.base").write_text("boot snapshot ram")
    committed = workdir / "rollback"
    committed.mkdir()
    os.link(workdir / "memory.base", committed / "memory.base")
    (committed / "memory.delta").write_text("pages")
    (committed / "vmstate").write_text("device state")
    (committed / "rollback.json").write_text('{"memory": true, "kit": "kit1"}')
    await recover(h.manager)
    saved = h.manager.machines.snapshot_dir(sid)
    assert sorted(p.name for p in saved.iterdir()) == ["memory.delta", "vmstate"]
    assert (workdir / "memory.base").read_text() == "boot snapshot ram"


async def test_an_uncommitted_rollback_leaves_the_sandbox_running(h: Harness) -> None:
    sid = await crashed_in(h, State.ROLLING_BACK, saved=False, alive=True)
    await recover(h.manager)
    assert await h.state(sid) == "running" and h.manager.routes.get(sid) is not None


async def _stored(h: Harness, uploads: Uploads, sid: str) -> SandboxRecord:
    await uploads.scan()
    for _ in range(200):
        record = await h.manager.store.get(sid)
        assert record is not None
        if record.stored:
            return record
        await asyncio.sleep(0.01)
    raise AssertionError(f"not stored: {uploads.errors}")


async def test_a_stored_paused_sandbox_resumes_without_its_local_files(
    h: Harness, tmp_path: Path
) -> None:
    sid = await h.create()
    workdir = h.manager.machines.workdir(sid)
    (workdir / "memory").write_bytes(b"guest ram" * 1000)
    await h.pauses.pause(sid)
    uploads = Uploads(h.manager, h.pauses.objects)
    record = await _stored(h, uploads, sid)
    assert set(record.layers) == {"rootfs.qcow2", "memory", "state/vmstate"}
    # The node's copy goes (its home was lost); the record and the store remain.
    shutil.rmtree(workdir)
    assert h.manager.machines.saved_state_intact(record)
    await h.pauses.resume(sid, 60)
    # The stored RAM is served as the base of a saved state with no pages of its own.
    assert (workdir / guestram.BASE).read_bytes() == b"guest ram" * 1000
    assert not (workdir / guestram.OWN).exists()
    record = await h.manager.store.get(sid)
    assert record is not None and record.state == "running" and not record.stored


async def test_an_upload_that_fails_is_shown_and_retried(h: Harness) -> None:
    sid = await h.create()
    await h.pauses.pause(sid)
    store = h.pauses.objects
    uploads = Uploads(h.manager, store)
    real_put = store.put
    store.put = lambda *a: (_ for _ in ()).throw(ObjectStoreError("store unreachable"))  # type: ignore[method-assign]
    await uploads.scan()
    for _ in range(200):
        if sid in uploads.errors:
            break
        await asyncio.sleep(0.01)
    assert "unreachable" in uploads.errors[sid]
    record = await h.manager.store.get(sid)
    assert record is not None and record.state == "paused" and not record.stored
    store.put = real_put  # type: ignore[method-assign]
    uploads._retry_at.clear()
    await _stored(h, uploads, sid)
    # The error is cleared when the upload's task ends, just after it records the layers.
    for _ in range(200):
        if sid not in uploads.errors:
            break
        await asyncio.sleep(0.01)
    assert sid not in uploads.errors


async def test_resume_cancels_an_upload_under_way(h: Harness) -> None:
    sid = await h.create()
    await h.pauses.pause(sid)
    gate = threading.Event()
    uploads = Uploads(h.manager, h.pauses.objects)
    real = persist.upload_files
    persist.upload_files = lambda *a: (gate.wait(5), real(*a))[1]  # type: ignore[assignment]
    try:
        await uploads.scan()
        await h.pauses.resume(sid, 60)
    finally:
        gate.set()
        persist.upload_files = real  # type: ignore[assignment]
    await asyncio.sleep(0.05)
    record = await h.manager.store.get(sid)
    assert record is not None and record.state == "running" and not record.stored


async def test_a_snapshots_lineage_never_replaces_stored_paused_layers(h: Harness) -> None:
    """A snapshot's upload finishing after its source's pause was stored must not make the
    record name the snapshot's layers as its paused files."""
    sid = await h.create()
    await h.manager.set_lineage(sid, {"memory": "snapshot-layer"})
    record = await h.manager.store.get(sid)
    assert record is not None and (record.layers, record.stored) == (
        {"memory": "snapshot-layer"},
        False,
    )
    await h.manager.set_lineage(sid, {"memory": "paused-layer"}, stored=True)
    await h.manager.set_lineage(sid, {"memory": "late-snapshot-layer"})
    record = await h.manager.store.get(sid)
    assert record is not None and (record.layers, record.stored) == (
        {"memory": "paused-layer"},
        True,
    )


async def test_snapshot_copies_fetched_before_the_host_rebooted_are_dropped(h: Harness) -> None:
    registry = SnapshotRegistry(h.pauses.objects)
    snapshots = SandboxSnapshots(
        h.pauses, registry, h.manager.machines.catalog, Uploads(h.manager, h.pauses.objects)
    )
    records = []
    for boot in ("an-earlier-boot", Path("/proc/sys/kernel/random/boot_id").read_text().strip()):
        record = SnapshotRecord(
            name=new_name(), tag=new_tag(), source_sandbox="i1", template_id="base",
            memory=True, vcpus=1, memory_mb=256, kit="kit1",
        )  # fmt: skip
        registry.save(record)
        snapshots.files(record).mkdir(parents=True)
        (snapshots.files(record) / "memory").write_bytes(b"ram")
        snapshots._fetched(record).parent.mkdir(parents=True, exist_ok=True)
        snapshots._fetched(record).write_text(boot)
        records.append(record)
    assert await snapshots.open() == 1
    assert not snapshots.files(records[0]).exists() and snapshots.files(records[1]).exists()


async def test_a_grown_template_disk_is_what_its_sandboxes_are_admitted_for(h: Harness) -> None:
    """A build's minFreeDiskMb grew the template's filesystem: admission counts all of it."""
    rootfs = h.manager.machines.catalog.resolve("base").rootfs
    grown_mb = h.manager.cfg.sandbox.disk_size_mb * 2
    with rootfs.open("r+b") as disk:  # a larger disk yet, as a built template's
        disk.truncate(grown_mb * 4 << 20)
    mkfs = ["mkfs.ext4", "-q", "-F", "-b", "4096", str(rootfs), f"{grown_mb}M"]
    subprocess.run(mkfs, check=True, capture_output=True)
    record = await h.manager.store.get(await h.create())
    assert record is not None
    assert record.disk_mb == grown_mb


async def test_a_pause_starts_its_upload_at_once_and_can_be_waited_for(h: Harness) -> None:
    uploads = Uploads(h.manager, h.pauses.objects)
    scanner = asyncio.create_task(uploads.run())
    try:
        sid = await h.create()
        await asyncio.sleep(0.05)  # the first scan found nothing, and waits a second
        loop = asyncio.get_running_loop()
        started = loop.time()
        await h.pauses.pause(sid)
        await asyncio.wait_for(uploads.until_stored(sid), 5)
        # Woken by the pause, not by the next scan a second later.
        assert loop.time() - started < SCAN_INTERVAL
        record = await h.manager.store.get(sid)
        assert record is not None and record.stored
        await h.pauses.resume(sid, 60)
        with pytest.raises(Conflict, match="no longer paused"):
            await uploads.until_stored(sid)
    finally:
        scanner.cancel()
        await uploads.close()


async def test_waiting_for_a_failing_upload_ends_naming_its_error(h: Harness) -> None:
    sid = await h.create()
    await h.pauses.pause(sid)
    store = h.pauses.objects
    uploads = Uploads(h.manager, store)
    store.put = lambda *a: (_ for _ in ()).throw(ObjectStoreError("store unreachable"))  # type: ignore[method-assign]
    await uploads.scan()
    with pytest.raises(Unavailable, match=r"not stored in 0.5 s: .*store unreachable"):
        await uploads.until_stored(sid, timeout=0.5)
    await uploads.close()
