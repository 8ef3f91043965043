"""Garbage collection of the object store: layers (index and block digests) and chunks
that no root reaches any more. Roots are layer ids: templates', snapshots', sandboxes'
and the stacks a node's block daemon serves (`runtime/node/collect.py` gathers them).

Two races make a naive sweep unsafe: a writer reuses a chunk or a layer that is already
stored without writing it again, and a layer is referenced only once the record naming it
(template, snapshot, sandbox) is saved after it. So writers and the collector exclude each
other through the store itself: a writer holds a lease (`gc/leases/<id>`) from before it
looks at what is stored until its record is saved, and the collector sets `gc/sweeping`,
waits until no lease is live, then marks and sweeps; a writer that finds the marker waits
for it to go. Objects younger than a grace period are spared too, for writers that hold
no lease.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from .layer import LayerIndex, chunk_key, layer_key
from .objectstore import ObjectNotFound, ObjectStore, ObjectStoreError

MARKER = "gc/sweeping"
_LEASES = "gc/leases/"
# A lease outlives a writer that died holding it by this long.
LEASE_TTL = 3600.0
_POLL = 0.2


class CollectorBusy(ObjectStoreError):
    """The collector is sweeping and did not finish within the writer's patience."""


@dataclass
class CollectReport:
    layers: int = 0
    chunks: int = 0
    kept_layers: int = 0
    kept_chunks: int = 0
    # True when live writer leases kept the collector from sweeping at all.
    skipped: bool = False


def _expiry(store: ObjectStore, key: str) -> float:
    try:
        return float(json.loads(store.get(key))["expires"])
    except (ObjectNotFound, ValueError, KeyError, TypeError):
        return 0.0


def _sweeping(store: ObjectStore) -> bool:
    return _expiry(store, MARKER) > time.time()


class WriteLease:
    """Held by a writer from before it looks at what is stored until the record naming
    what it wrote is saved; while any is live the collector does not sweep."""

    def __init__(self, store: ObjectStore, patience: float = 600.0) -> None:
        self._store = store
        self._patience = patience
        self._key = _LEASES + secrets.token_hex(8)

    def acquire(self) -> WriteLease:
        """Blocking: waits while the collector sweeps (CollectorBusy after `patience`)."""
        deadline = time.monotonic() + self._patience
        while True:
            while _sweeping(self._store):
                if time.monotonic() > deadline:
                    raise CollectorBusy("the object store's collector is sweeping; try again")
                time.sleep(_POLL)
            expires = time.time() + LEASE_TTL
            self._store.put(self._key, json.dumps({"expires": expires}).encode())
            if not _sweeping(self._store):
                return self
            self._store.delete(self._key)  # the collector started in between: let it finish

    def release(self) -> None:
        self._store.delete(self._key)


@contextmanager
def write_lease(store: ObjectStore, patience: float = 600.0) -> Iterator[None]:
    lease = WriteLease(store, patience).acquire()
    try:
        yield
    finally:
        lease.release()


@asynccontextmanager
async def async_write_lease(store: ObjectStore) -> AsyncIterator[None]:
    """`write_lease` for a coroutine. Cancelled while acquiring, it still releases the
    lease the acquiring thread goes on to write: a lease left behind would keep the
    collector out for `LEASE_TTL`."""
    lease = WriteLease(store)
    acquiring = asyncio.ensure_future(asyncio.to_thread(lease.acquire))
    try:
        await asyncio.shield(acquiring)
    except asyncio.CancelledError:
        acquiring.add_done_callback(lambda done: _release_once_acquired(done, lease))
        raise
    try:
        yield
    finally:
        await asyncio.shield(asyncio.to_thread(lease.release))


def _release_once_acquired(acquiring: asyncio.Future[WriteLease], lease: WriteLease) -> None:
    if not acquiring.cancelled() and acquiring.exception() is None:
        asyncio.get_running_loop().run_in_executor(None, lease.release)


def _live_leases(store: ObjectStore) -> list[str]:
    now = time.time()
    return [k for k in store.list(_LEASES) if _expiry(store, k) > now]


def reachable(store: ObjectStore, roots: Iterable[str]) -> tuple[set[str], set[str]]:
    """Layers reached from `roots` through their parents, and the chunks those use."""
    layers: set[str] = set()
    chunks: set[str] = set()
    pending = [r for r in roots if r]
    while pending:
        layer_id = pending.pop()
        if layer_id in layers:
            continue
        try:
            index = LayerIndex.from_json(store.get(layer_key(layer_id)))
        except ObjectNotFound:
            continue  # a root whose layer is gone: nothing of it to keep
        layers.add(layer_id)
        chunks.update(ref.chunk for ref in index.blocks.values())
        if index.parent:
            pending.append(index.parent)
    return layers, chunks


def collect(
    store: ObjectStore,
    roots: Callable[[], Iterable[str]],
    grace: float,
    wait: float = 60.0,
) -> CollectReport:
    """Delete what `roots()` do not reach and is older than `grace` seconds. The roots
    are read once no writer holds a lease, so none is added unseen meanwhile."""
    report = CollectReport()
    store.put(MARKER, json.dumps({"expires": time.time() + wait + LEASE_TTL}).encode())
    try:
        deadline = time.monotonic() + wait
        while _live_leases(store):
            if time.monotonic() > deadline:
                report.skipped = True
                return report
            time.sleep(_POLL)
        keep_layers, keep_chunks = reachable(store, roots())
        ages = store.ages("layers/")
        for key, age in ages.items():
            layer_id = key.removeprefix("layers/").removesuffix(".json")
            if layer_id in keep_layers or age < grace:
                report.kept_layers += 1
                continue
            # The index first: a layer without one is invisible, never half there.
            store.delete(key)
            report.layers += 1
        for key, age in store.ages("digests/").items():
            if key.removeprefix("digests/") not in keep_layers and age >= grace:
                store.delete(key)
        for key, age in store.ages("chunks/").items():
            if key.removeprefix("chunks/") in keep_chunks or age < grace:
                report.kept_chunks += 1
                continue
            store.delete(chunk_key(key.removeprefix("chunks/")))
            report.chunks += 1
        return report
    finally:
        store.delete(MARKER)
