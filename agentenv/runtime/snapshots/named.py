"""Snapshots of running sandboxes, kept under a name, and sandboxes started from them.

A snapshot is a checkpoint (`checkpoint.py`) kept in `<home>/snapshots/<name>/<tag>/` and
recorded in the snapshot registry once its files are whole; the source only freezes for the
copies. Sandboxes made from it get copies of its files, so deleting a snapshot never takes
anything from them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from ...crashpoints import crash_point
from ...errors import Conflict, InvalidInput, Unavailable
from ...images.catalog import BASE, TemplateCatalog
from ...images.snapshots import SNAPSHOT, SnapshotRecord, SnapshotRegistry, new_name, new_tag
from ...images.templates import validate_name
from ...observe.metrics import timed
from ...state.lifecycle import Event, allows
from ...state.sandboxes import FILESYSTEM, FULL, SandboxRecord
from ...storage.objectstore import ObjectStoreError
from ...vmm import guestram
from ...vmm.driver import VmHandle, VmmError
from ...vmm.qemuimg import copy_sparse
from ..machine.bootsnap import Shape
from ..machine.guestconfig import DISK_TEMPLATE, disk_template
from ..sandboxes.creation import CreateRequest, requested_record
from ..sandboxes.intake import now
from ..sandboxes.manager import SandboxManager
from .checkpoint import (
    DISK,
    MEMORY,
    copy_paused,
    provision_from_checkpoint,
    take_checkpoint,
)
from .pause import SandboxPauses
from .persist import Uploads, fetch_files

log = logging.getLogger(__name__)

# A snapshot's files are staged here and renamed into place once whole.
_STAGING = ".staging"
# Markers of snapshot files fetched from the object store (see `_fetched`).
_FETCHED = ".fetched"
# In a sandbox's directory: a rollback's files, renamed there when it commits.
ROLLBACK_DIR = "rollback"
_ROLLBACK_META = "rollback.json"


class SandboxSnapshots:
    """Take, list, start from and delete the snapshots of one node's sandboxes."""

    def __init__(
        self,
        pauses: SandboxPauses,
        registry: SnapshotRegistry,
        catalog: TemplateCatalog,
        uploads: Uploads,
    ) -> None:
        self.pauses = pauses
        self.uploads = uploads
        self.manager = pauses.manager
        self.registry = registry
        self.catalog = catalog
        self.root = self.manager.cfg.home / "snapshots"
        self._fetching: dict[str, asyncio.Lock] = {}
        # An upload's record update and a delete, one at a time: an upload finishing just
        # as its snapshot is deleted must not write the record back.
        self._records = asyncio.Lock()

    def files(self, snapshot: SnapshotRecord) -> Path:
        return self.root / snapshot.name / snapshot.tag

    def local_ids(self) -> list[str]:
        """Blocking: the snapshots (`name:tag`) whose files are on this node."""
        if not self.root.is_dir():
            return []
        return sorted(
            f"{name.name}:{tag.name}"
            for name in self.root.iterdir()
            if name.is_dir() and not name.name.startswith(".")
            for tag in name.iterdir()
            if tag.is_dir()
        )

    def _fetched(self, snapshot: SnapshotRecord) -> Path:
        """Marks a copy fetched from the object store, with the host's boot it was made in."""
        return self.root / _FETCHED / f"{snapshot.name}:{snapshot.tag}"

    async def take(
        self,
        sandbox_id: str,
        name: str | None,
        memory: bool,
        *,
        guest: dict[str, Any] | None = None,
        kind: str = SNAPSHOT,
    ) -> SnapshotRecord:
        """Snapshot a running sandbox (it runs on) or a paused one (it stays paused) under
        `name` (a new one if None). `guest` overrides what its sandboxes' guests are given
        (a template build's final ENV, USER and WORKDIR)."""
        name = validate_name(name) if name else new_name()
        if name == BASE or bool(await asyncio.to_thread(self.catalog.templates.find, name)):
            raise Conflict(f"'{name}' names a template that is not a snapshot")
        tag = new_tag()
        staging = self.root / _STAGING / f"{name}-{tag}"
        staging.parent.mkdir(parents=True, exist_ok=True)

        async def freeze_and_copy(record: SandboxRecord) -> SandboxRecord:
            await take_checkpoint(self.manager, record, staging, memory)
            return record

        async def copy_files(record: SandboxRecord) -> SandboxRecord:
            await copy_paused(self.manager, record, staging, memory)
            return record

        # A running sandbox is frozen for the copy; a paused one's files are copied as
        # they are (it stays paused meanwhile).
        with timed("snapshot"):
            record = await self.manager.get(sandbox_id)
            if allows(record.state, Event.CHECKPOINT):
                source = await self.manager.operate(sandbox_id, Event.CHECKPOINT, freeze_and_copy)
            else:
                source = await self.manager.operate(sandbox_id, Event.COPY, copy_files)
            try:
                snapshot = SnapshotRecord(
                    name=name,
                    tag=tag,
                    source_sandbox=source.sandbox_id,
                    template_id=disk_template(source),
                    memory=memory,
                    vcpus=source.vcpus,
                    memory_mb=source.memory_mb,
                    kit=self.manager.machines.pinned_kit(source).version,
                    guest={
                        **source.guest,
                        "env": {**source.guest.get("env", {}), **source.env_vars},
                        **(guest or {}),
                    },
                    kind=kind,
                    metadata=dict(source.metadata),
                    size=await asyncio.to_thread(_allocated_bytes, staging),
                    base=dict(source.layers),
                )
                crash_point("snapshot.copied")
                await asyncio.to_thread(self._publish, staging, snapshot)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, staging, True)
                raise
        log.info("sandbox %s snapshotted as %s", sandbox_id, snapshot.snapshot_id)
        self._upload(snapshot)
        return snapshot

    def _upload(self, snapshot: SnapshotRecord) -> None:
        self.uploads.start(
            self.uploads.upload_snapshot(snapshot, self.files(snapshot), self._saved)
        )

    async def _saved(self, snapshot: SnapshotRecord) -> None:
        """Record an uploaded snapshot's layers, unless it was deleted meanwhile; its
        source's next upload or snapshot is diffed against them."""
        async with self._records:
            if await asyncio.to_thread(self.registry.find, snapshot.snapshot_id) is not None:
                await asyncio.to_thread(self.registry.save, snapshot)
        await self.manager.set_lineage(snapshot.source_sandbox, snapshot.stored)

    async def open(self) -> int:
        """At start: reclaim what a dead server left (see `_reclaim`), then upload the
        snapshots taken here that are not stored yet; how many leftovers went."""
        snapshots = await asyncio.to_thread(self.registry.list)
        reclaimed = await asyncio.to_thread(self._reclaim, snapshots)
        for snapshot in snapshots:
            if not snapshot.stored and self.files(snapshot).is_dir():
                self._upload(snapshot)
        return reclaimed

    async def local_files(self, snapshot: SnapshotRecord) -> Path:
        """The snapshot's files on this node, fetched from the object store if needed."""
        files = self.files(snapshot)
        # Concurrent creates from one snapshot fetch it once.
        async with self._fetching.setdefault(snapshot.snapshot_id, asyncio.Lock()):
            if files.is_dir():
                return files
            if not snapshot.stored:
                raise Unavailable(
                    f"snapshot {snapshot.snapshot_id}: its files are on another node and "
                    "not uploaded yet"
                )
            staging = self.root / _STAGING / f"{snapshot.name}-{snapshot.tag}-fetch"
            await asyncio.to_thread(shutil.rmtree, staging, True)
            try:
                # A cache, written without waiting for the disk: a copy made before the
                # host last booted is not trusted (`reclaim`).
                template = await asyncio.to_thread(self.catalog.resolve, snapshot.template_id)
                await asyncio.to_thread(
                    partial(
                        fetch_files,
                        self.uploads.store,
                        snapshot.stored,
                        staging,
                        staging,
                        durable=False,
                        ram=self.pauses.ram,
                        template=template,
                    )
                )
                files.parent.mkdir(parents=True, exist_ok=True)
                self._fetched(snapshot).parent.mkdir(parents=True, exist_ok=True)
                self._fetched(snapshot).write_text(_boot_id())
                staging.rename(files)
            except BaseException as exc:
                await asyncio.to_thread(shutil.rmtree, staging, True)
                if isinstance(exc, (ObjectStoreError, OSError, VmmError)):
                    raise Unavailable(
                        f"snapshot {snapshot.snapshot_id}: fetching its files failed: {exc}"
                    ) from exc
                raise
        return files

    def _publish(self, staging: Path, snapshot: SnapshotRecord) -> None:
        """Files into place, then the record: a recorded snapshot always has whole files."""
        target = self.files(snapshot)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(target)
        crash_point("snapshot.placed")
        self.registry.save(snapshot)

    async def create(self, snapshot: SnapshotRecord, request: CreateRequest) -> SandboxRecord:
        """A new sandbox from a snapshot: its memory restored, or (filesystem-only) a
        fresh guest on a copy of its disk; the request's env vars are added. A restored
        guest keeps the snapshot's CPUs: a request for others is refused."""
        if snapshot.memory and request.vcpus not in (None, snapshot.vcpus):
            raise InvalidInput(
                f"'{snapshot.name}' starts from a running guest's snapshot with "
                f"{snapshot.vcpus} CPUs; its sandboxes cannot have {request.vcpus} "
                "(its size is fixed)"
            )
        # The snapshot's disk is an overlay of its template's: that must be served.
        await asyncio.to_thread(self.catalog.resolve, snapshot.template_id)
        checkpoint = await self.local_files(snapshot)
        kit = self.manager.machines.kit
        if snapshot.memory:
            kit = self.manager.machines.kit_version(snapshot.kit)
        record = await requested_record(
            self.manager,
            request,
            template_id=snapshot.snapshot_id,
            alias=snapshot.name,
            shape=Shape(request.vcpus or snapshot.vcpus, snapshot.memory_mb),
            guest={**snapshot.guest, DISK_TEMPLATE: snapshot.template_id},
            layers=snapshot.stored or snapshot.base,
        )
        return await self.manager.bring_up(
            record,
            lambda cleanup: provision_from_checkpoint(
                self.manager, record, checkpoint, kit, cleanup
            ),
        )

    async def rollback(self, sandbox_id: str, ref: str) -> SandboxRecord:
        """Put a running or paused sandbox back to a snapshot in place: same id, token,
        routes and expiry; it runs from the snapshot's memory (or a fresh guest on its disk)."""
        snapshot = await asyncio.to_thread(self.registry.get, ref)
        record = await self.manager.get(sandbox_id)
        if (snapshot.vcpus, snapshot.memory_mb) != (record.vcpus, record.memory_mb):
            raise InvalidInput(
                f"snapshot {snapshot.snapshot_id} has {snapshot.vcpus} vCPUs and "
                f"{snapshot.memory_mb} MB; sandbox '{sandbox_id}' has {record.vcpus} and "
                f"{record.memory_mb}"
            )
        files = await self.local_files(snapshot)
        await asyncio.to_thread(self.catalog.resolve, snapshot.template_id)
        # Staged beside the sandbox's files before anything changes; a failure here
        # leaves the sandbox as it was.
        staging = self.manager.machines.workdir(sandbox_id) / f"rollback-{new_tag()}.partial"
        await asyncio.to_thread(_stage, files, staging, snapshot)

        async def body(record: SandboxRecord) -> SandboxRecord:
            staging.rename(self.manager.machines.workdir(sandbox_id) / ROLLBACK_DIR)
            crash_point("rollback.committed")
            await finish_rollback(self.manager, record)
            crash_point("rollback.applied")
            await self.pauses.wake(record)
            if record.end_at <= now():
                record.end_at = now() + timedelta(seconds=self.manager.cfg.sandbox.default_timeout)
                await self.manager.store.update(sandbox_id, end_at=record.end_at)
            return record

        try:
            record = await self.manager.operate(sandbox_id, Event.ROLLBACK, body, admit_memory=True)
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        log.info("sandbox %s rolled back to %s", sandbox_id, snapshot.snapshot_id)
        return record

    async def delete(self, ref: str) -> list[SnapshotRecord]:
        """Forget `name` (every build) or `name:tag`, and remove their files."""
        async with self._records:
            gone = await asyncio.to_thread(self.registry.delete, ref)
        for snapshot in gone:
            await asyncio.to_thread(shutil.rmtree, self.files(snapshot), True)
            self._fetched(snapshot).unlink(missing_ok=True)
        return gone

    def _reclaim(self, snapshots: list[SnapshotRecord]) -> int:
        """Staged copies, files no record names, and fetched copies from before the host's
        current boot."""
        if not self.root.exists():
            return 0
        known = {self.files(s) for s in snapshots}
        stray = list((self.root / _STAGING).glob("*"))
        stray += list(self.manager.cfg.sandboxes_dir.glob("*/rollback-*.partial"))
        for name_dir in self.root.iterdir():
            if name_dir.name not in (_STAGING, _FETCHED):
                stray += [d for d in name_dir.iterdir() if d not in known]
        # Fetched copies the disk may not hold whole after a crash of the host itself.
        boot = _boot_id()
        for snapshot in snapshots:
            marker = self._fetched(snapshot)
            if marker.exists() and marker.read_text() != boot:
                stray.append(self.files(snapshot))
                marker.unlink()
        for directory in stray:
            shutil.rmtree(directory, ignore_errors=True)
        return len(stray)


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _stage(files: Path, staging: Path, snapshot: SnapshotRecord) -> None:
    staging.mkdir()
    for path in files.iterdir():
        if path.name == guestram.WHOLE:
            continue  # an upload's temporary file
        if path.name == guestram.BASE and guestram.link_base(path, staging):
            continue  # never written: shared, not copied
        copy_sparse(path, staging / path.name)
    meta = {
        "memory": snapshot.memory,
        "kit": snapshot.kit,
        "layers": snapshot.stored or snapshot.base,
    }
    (staging / _ROLLBACK_META).write_text(json.dumps(meta))


async def finish_rollback(manager: SandboxManager, record: SandboxRecord) -> bool:
    """Once a rollback is committed (its staged files renamed into the sandbox's directory),
    stop the old VM and put the snapshot's files in place; idempotent, so recovery can
    finish what a dead server began. False when no rollback was committed."""
    workdir = manager.machines.workdir(record.sandbox_id)
    committed = workdir / ROLLBACK_DIR
    if not committed.is_dir():
        return False
    if record.vm is not None:
        # Its disk and RAM give way to the snapshot's.
        await manager.driver.discard(VmHandle.from_dict(record.vm))
    meta = json.loads((committed / _ROLLBACK_META).read_text())
    record.pause_mode = FULL if meta["memory"] else FILESYSTEM
    if record.vm is not None:
        record.vm["extra"] = {**record.vm.get("extra", {}), "kit": meta["kit"]}
    # Its files are the snapshot's now: uploads diff against the snapshot's layers.
    record.layers, record.stored = meta.get("layers", {}), False
    # Its memory is the snapshot's now, not the one a silent agent may have been paused in.
    record.agent_unresponsive_at_pause = False
    await manager.store.update(
        record.sandbox_id,
        pause_mode=record.pause_mode,
        vm=record.vm,
        layers=record.layers,
        stored=False,
        agent_unresponsive_at_pause=False,
    )
    await asyncio.to_thread(
        _move_into_place,
        committed,
        workdir,
        manager.machines.snapshot_dir(record.sandbox_id),
        meta["memory"],
    )
    return True


def _move_into_place(committed: Path, workdir: Path, device_state: Path, memory: bool) -> None:
    """Disk and RAM into the work directory; the rest (device state) becomes its saved
    state. Each step is a rename, and a repeat skips what already moved."""
    if not memory:
        guestram.drop(workdir)
    if (committed / DISK).exists():
        (committed / DISK).rename(workdir / DISK)
    # The snapshot's RAM replaces the sandbox's, whichever kind each is (its own file, or
    # a base with the delta that stays among the saved state).
    for name, other in ((MEMORY, guestram.BASE), (guestram.BASE, MEMORY)):
        if (committed / name).exists():
            # Unlinked first: renaming one link of a file over another is a no-op.
            for old in (other, name):
                (workdir / old).unlink(missing_ok=True)
            (committed / name).rename(workdir / name)
    shutil.rmtree(device_state, ignore_errors=True)
    committed.rename(device_state)
    (device_state / _ROLLBACK_META).unlink()


def _allocated_bytes(directory: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in directory.iterdir() if p.is_file())
