"""Stored guest RAM served lazily: a paused sandbox or a snapshot fetched from the object
store maps its RAM through a read-only file of the block daemon, so a restore reads only
the pages its guest touches, in chunks through the node's chunk cache.

The file (`ram-<top layer id>.img`) is the base of a saved state with no pages of its own
(`guestram.serve_base`); clones link to it like to any snapshot's RAM, and their pages
are shared in the host page cache. A mount lives while a link names it: `sweep` unmounts
those no work directory or snapshot has linked to for two rounds in a row (two, so a
link being renamed from one directory to another is never missed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path
from typing import Protocol

from ...storage.blockd import BlockdClient
from ...storage.filelayer import load_chain
from ...storage.objectstore import ObjectStore
from ...vmm import guestram

log = logging.getLogger(__name__)

_PREFIX = "ram-"


class RamServer(Protocol):
    """Where a stored RAM layer becomes a file a VMM can map."""

    def serve(self, layer_id: str) -> Path:
        """Blocking: a read-only file with the content of RAM layer `layer_id`."""
        ...


class ServedRam:
    """RAM layers served by the node's block daemon, unmounted once nothing links them."""

    def __init__(self, blockd: BlockdClient, store: ObjectStore, roots: list[Path]) -> None:
        self.blockd = blockd
        self.store = store
        self.roots = roots
        self._lock = threading.Lock()
        self._unlinked: set[str] = set()

    def serve(self, layer_id: str) -> Path:
        name = _PREFIX + layer_id
        with self._lock:
            # Served again: a sweep that saw it unlinked starts counting afresh.
            self._unlinked.discard(name)
        path, _ = self.blockd.mount(name, load_chain(self.store, layer_id).layer_ids)
        # What the guest does not touch soon arrives in the background, at low priority.
        self.blockd.prefetch(name)
        return path

    def sweep(self) -> int:
        """Blocking: unmount the RAM nothing has linked to since the last sweep; how many."""
        mounts = {
            mount["name"]: mount["path"]
            for mount in self.blockd.status().get("mounts", [])
            if mount["name"].startswith(_PREFIX)
        }
        linked = self._linked()
        # Under the lock: a `serve` of one of these either came first (and it is not
        # stale) or comes after its unmount (and mounts it again).
        with self._lock:
            unlinked = {name for name, path in mounts.items() if path not in linked}
            stale = unlinked & self._unlinked
            self._unlinked = unlinked - stale
            for name in stale:
                self.blockd.unmount(name)
                log.info("unmounted %s: nothing links to it", name)
        return len(stale)

    async def run_every(self, interval: float) -> None:
        """Sweep every `interval` seconds until cancelled; a failed round is logged."""
        while True:
            await asyncio.sleep(interval)
            try:
                await asyncio.to_thread(self.sweep)
            except Exception:
                log.exception("sweeping served RAM failed")

    def _linked(self) -> set[str]:
        """Every file a RAM base link under the roots names."""
        linked: set[str] = set()
        for root in self.roots:
            for directory, _, files in os.walk(root):
                if guestram.BASE in files:
                    path = os.path.join(directory, guestram.BASE)
                    if os.path.islink(path):
                        linked.add(os.readlink(path))
        return linked
