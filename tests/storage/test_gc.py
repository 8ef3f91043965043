"""The object store's collector: what roots reach stays, the rest goes after the grace
period, and it never sweeps while a writer holds a lease."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from agentenv.storage import gc
from agentenv.storage.filelayer import load_chain, materialize, store_file
from agentenv.storage.gc import CollectorBusy, async_write_lease, collect, write_lease
from agentenv.storage.layer import BLOCK_SIZE
from agentenv.storage.posix import PosixObjectStore


def _file(path: Path, *blocks: bytes) -> Path:
    path.write_bytes(b"".join(b.ljust(BLOCK_SIZE, b"\0") for b in blocks))
    return path


def _age_everything(root: Path, seconds: float) -> None:
    past = time.time() - seconds
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, (past, past))


def test_unreachable_layers_and_chunks_go_reachable_ones_stay(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    kept_v1, _ = store_file(store, _file(tmp_path / "a", b"one", b"two"), None)
    kept_v2, _ = store_file(store, _file(tmp_path / "a", b"one", b"TWO"), kept_v1)
    dropped, _ = store_file(store, _file(tmp_path / "b", b"gone", b"away"), None)
    _age_everything(tmp_path / "objects", 7200)

    report = collect(store, lambda: {kept_v2}, grace=3600)
    assert (report.layers, report.skipped) == (1, False)
    assert report.chunks >= 1
    assert not store.exists(f"layers/{dropped}.json")
    assert not store.exists(f"digests/{dropped}")
    # The kept version reads back whole, its parent included.
    materialize(load_chain(store, kept_v2), store, tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == (tmp_path / "a").read_bytes()
    assert not store.exists(gc.MARKER)


def test_young_objects_are_spared(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    fresh, _ = store_file(store, _file(tmp_path / "a", b"new"), None)
    report = collect(store, set, grace=3600)
    assert report.layers == 0 and store.exists(f"layers/{fresh}.json")


def test_a_live_writer_lease_keeps_the_collector_out(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    layer, _ = store_file(store, _file(tmp_path / "a", b"x"), None)
    _age_everything(tmp_path / "objects", 7200)
    with write_lease(store):
        report = collect(store, set, grace=3600, wait=0.3)
    assert report.skipped and store.exists(f"layers/{layer}.json")


def test_a_writer_waits_while_the_collector_sweeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    sweeping = threading.Event()
    release = threading.Event()

    def slow_roots() -> set[str]:
        sweeping.set()
        release.wait(5)
        return set()

    collector = threading.Thread(target=collect, args=(store, slow_roots, 3600.0))
    collector.start()
    assert sweeping.wait(5)
    with pytest.raises(CollectorBusy):
        with write_lease(store, patience=0.3):
            pass
    release.set()
    collector.join(5)
    with write_lease(store, patience=1):
        assert store.list("gc/leases/")
    assert store.list("gc/leases/") == []


async def test_a_writer_cancelled_while_acquiring_leaves_no_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acquiring thread writes its lease after the cancel: it must still go, or the
    collector would skip every run for an hour."""
    store = PosixObjectStore(tmp_path / "objects")
    writing = threading.Event()
    put = store.put

    def slow_put(key: str, data: bytes) -> None:
        writing.set()
        time.sleep(0.3)
        put(key, data)

    monkeypatch.setattr(store, "put", slow_put)

    async def writer() -> None:
        async with async_write_lease(store):
            raise AssertionError("never acquired: cancelled first")

    task = asyncio.create_task(writer())
    await asyncio.to_thread(writing.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.5)  # the thread has written its lease by now
    deadline = time.monotonic() + 5
    while leases := store.list("gc/leases/"):
        assert time.monotonic() < deadline, leases
        await asyncio.sleep(0.05)
    async with async_write_lease(store):
        assert len(store.list("gc/leases/")) == 1
    assert store.list("gc/leases/") == []
