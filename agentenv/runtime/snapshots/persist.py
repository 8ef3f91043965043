"""Persistence: paused sandboxes and snapshots uploaded to the object store as layers, in
the background, and fetched back on a node that does not hold them.

Each file (disk, RAM, device state) is stored over the layer of its previous upload
(`storage/filelayer.py`), so an upload writes what changed since. A paused sandbox is
`stored` once its files are uploaded; from then on its node's copy is a cache: any node
sharing the state store and the object store can resume it. What a node fetches back is
the disk and device state; the RAM is served page by page (`servedram.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ...crashpoints import crash_point
from ...errors import Conflict, Unavailable
from ...images.catalog import Template
from ...images.snapshots import SnapshotRecord
from ...state.sandboxes import FILESYSTEM, SandboxRecord
from ...storage.filelayer import load_chain, materialize, store_file
from ...storage.gc import async_write_lease
from ...storage.layer import BLOCK_SIZE
from ...storage.objectstore import ObjectStore
from ...vmm import guestram
from ...vmm.qemuimg import set_backing
from ..sandboxes.manager import SandboxManager
from .checkpoint import DISK, MEMORY
from .servedram import RamServer

log = logging.getLogger(__name__)

SnapshotSaver = Callable[[SnapshotRecord], Awaitable[None]]

# Guest RAM is diffed page by page: guests write pages here and there.
PAGE_SIZE = 4096
# Stored names of device-state files, which live apart from the disk and RAM.
_STATE_PREFIX = "state/"
# Seconds between scans for paused sandboxes to upload (a sandbox coming to rest starts
# one at once); failures back off to a minute.
SCAN_INTERVAL = 1.0
# Seconds a pause asked to return once stored (`waitStored`) waits for its upload.
STORE_WAIT = 600.0
STORED_POLL = 0.05
_MAX_BACKOFF = 60.0


def saved_files(files_dir: Path, state_dir: Path, memory: bool) -> dict[str, Path]:
    """What a saved sandbox consists of, by stored name: its disk, its RAM (with
    `memory`) and every device-state file."""
    files = {DISK: files_dir / DISK}
    if memory:
        files[MEMORY] = files_dir / MEMORY
        for path in sorted(state_dir.iterdir()):
            # A base and its delta are stored as the whole RAM they make (`upload_saved`).
            if path.is_file() and path.name != DISK and path.name not in guestram.RAM_FILES:
                files[_STATE_PREFIX + path.name] = path
    return files


def upload_files(
    store: ObjectStore, files: dict[str, Path], parents: dict[str, str]
) -> tuple[dict[str, str], int]:
    """Blocking: each file as a layer over its parent; the layers and bytes written."""
    layers: dict[str, str] = {}
    written = 0
    for name, path in files.items():
        block_size = PAGE_SIZE if name == MEMORY else BLOCK_SIZE
        layers[name], size = store_file(store, path, parents.get(name), block_size)
        written += size
    return layers, written


def upload_saved(
    store: ObjectStore, workdir: Path, state_dir: Path, memory: bool, parents: dict[str, str]
) -> tuple[dict[str, str], int]:
    """Blocking: a paused sandbox's or a snapshot's files as layers, the RAM as one whole
    file even where it is a base and a delta; the layers and bytes written."""
    files = saved_files(workdir, state_dir, memory)
    if not memory:
        return upload_files(store, files, parents)
    with guestram.whole_file(workdir, state_dir) as ram:
        # The RAM first: it is most of what changed, and the disk often changed little.
        rest = {name: path for name, path in files.items() if name != MEMORY}
        return upload_files(store, {MEMORY: ram, **rest}, parents)


def fetch_files(
    store: ObjectStore,
    layers: dict[str, str],
    files_dir: Path,
    state_dir: Path,
    *,
    durable: bool,
    ram: RamServer,
    template: Template,
) -> None:
    """Blocking: write stored files back, but for the RAM, which `ram` serves as the base
    of the saved state, the disk over this node's copy of its `template`; device state
    last, since its presence is what says the files are whole (`durable`: each on disk
    before the next)."""
    files_dir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    names = sorted(layers, key=lambda n: n.startswith(_STATE_PREFIX))
    for name in names:
        if name == MEMORY:
            guestram.serve_base(ram.serve(layers[name]), files_dir, state_dir)
            continue
        if name.startswith(_STATE_PREFIX):
            dest = state_dir / name.removeprefix(_STATE_PREFIX)
        else:
            dest = files_dir / name
        partial = dest.with_name(dest.name + ".fetching")
        materialize(load_chain(store, layers[name]), store, partial, durable)
        if name == DISK:
            set_backing(partial, template.rootfs, template.rootfs_format)
        partial.rename(dest)


class Uploads:
    """Uploads in the background: snapshots as they are taken, paused sandboxes found by
    a scan; a failed upload is retried with backoff and its error shown meanwhile."""

    def __init__(self, manager: SandboxManager, store: ObjectStore) -> None:
        self.manager = manager
        self.store = store
        self.errors: dict[str, str] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._busy: set[str] = set()
        self._tasks: set[asyncio.Future[None]] = set()

    async def run(self) -> None:
        """Scan until cancelled, at once when a sandbox comes to rest; a failed pass is
        logged, not fatal."""
        rested = self.manager.came_to_rest
        while True:
            rested.clear()
            try:
                await self.scan()
            except Exception:
                log.exception("upload scan failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rested.wait(), SCAN_INTERVAL)

    async def until_stored(self, sandbox_id: str, timeout: float = STORE_WAIT) -> None:
        """Until the paused sandbox's state is in the object store; Unavailable naming
        the upload's last error if it is not within `timeout` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            record = await self.manager.store.get(sandbox_id)
            if record is None or not record.state.at_rest:
                raise Conflict(f"sandbox '{sandbox_id}' is no longer paused")
            if record.stored:
                return
            if loop.time() > deadline:
                why = self.errors.get(sandbox_id, "its upload is still under way")
                raise Unavailable(f"sandbox '{sandbox_id}' was not stored in {timeout:g} s: {why}")
            await asyncio.sleep(STORED_POLL)

    def start(self, body: Awaitable[None]) -> None:
        """Run a snapshot's upload in the background, ended by `close` (as are the
        uploads of paused sandboxes)."""
        task = asyncio.ensure_future(body)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- sandboxes -------------------------------------------------------------------

    async def scan(self) -> None:
        """Start an upload for each paused sandbox whose files are not stored yet."""
        for record in await self.manager.store.unstored():
            key = record.sandbox_id
            if key in self._busy:
                continue
            if time.monotonic() < self._retry_at.get(key, 0.0):
                continue
            if not self.manager.machines.local_state_intact(record):
                continue
            self._busy.add(key)
            task = self.manager.gate.read_paused(key, self._upload_sandbox(record))
            task.add_done_callback(functools.partial(self._finished, key))
            # `close` ends it too, before the state store it reports to is closed.
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _upload_sandbox(self, record: SandboxRecord) -> None:
        manager = self.manager
        async with async_write_lease(self.store):
            layers, written = await asyncio.to_thread(
                upload_saved,
                self.store,
                manager.machines.workdir(record.sandbox_id),
                manager.machines.snapshot_dir(record.sandbox_id),
                record.pause_mode != FILESYSTEM,
                record.layers,
            )
            crash_point("upload.stored")
            await manager.set_lineage(record.sandbox_id, layers, stored=True)
        log.info("sandbox %s stored (%d bytes written)", record.sandbox_id, written)

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        self._busy.discard(key)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            self._succeeded(key)
        else:
            self._failed(key, exc)

    # -- snapshots -------------------------------------------------------------------

    async def upload_snapshot(
        self, snapshot: SnapshotRecord, files_dir: Path, save: SnapshotSaver
    ) -> None:
        """Upload a snapshot's files and record their layers; retried until it works."""
        key = snapshot.snapshot_id
        while True:
            try:
                async with async_write_lease(self.store):
                    snapshot.stored, written = await asyncio.to_thread(
                        upload_saved,
                        self.store,
                        files_dir,
                        files_dir,
                        snapshot.memory,
                        snapshot.base,
                    )
                    await save(snapshot)
                log.info("snapshot %s stored (%d bytes written)", key, written)
                self._succeeded(key)
                return
            except FileNotFoundError:
                return  # deleted meanwhile
            except Exception as exc:
                self._failed(key, exc)
                await asyncio.sleep(self._retry_at[key] - time.monotonic())

    # -- bookkeeping -----------------------------------------------------------------

    def _succeeded(self, key: str) -> None:
        self.errors.pop(key, None)
        self._retry_at.pop(key, None)
        self._failures.pop(key, None)

    def _failed(self, key: str, exc: BaseException) -> None:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        self.errors[key] = str(exc) or type(exc).__name__
        self._retry_at[key] = time.monotonic() + min(_MAX_BACKOFF, 2.0**failures)
        log.warning("upload of %s failed (attempt %d): %s", key, failures, exc)
