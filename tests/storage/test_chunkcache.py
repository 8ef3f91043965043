"""The chunk cache: hits and misses, singleflight, verification, eviction, restart, prefetch."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from agentenv.config import load_config
from agentenv.storage import chunkcache
from agentenv.storage.chunkcache import ChunkCache, CorruptChunk
from agentenv.storage.layer import chunk_key
from agentenv.storage.objectstore import ObjectNotFound
from agentenv.storage.posix import PosixObjectStore
from agentenv.storage.stores import open_chunk_cache

KIB = 1024


class CountingStore(PosixObjectStore):
    """Counts `get`s per key; `delay` slows them and `gate`, if set, holds them."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gets: Counter[str] = Counter()
        self.delay = 0.0
        self.gate: dict[str, threading.Event] = {}
        self._count_lock = threading.Lock()

    def get(self, key: str) -> bytes:
        with self._count_lock:
            self.gets[key] += 1
        if key in self.gate:
            assert self.gate[key].wait(10)
        time.sleep(self.delay)
        return super().get(key)

    def add_chunk(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self.put(chunk_key(digest), data)
        return digest


@pytest.fixture
def store(tmp_path: Path) -> CountingStore:
    return CountingStore(tmp_path / "store")


def chunk(n: int, size: int = 100 * KIB) -> bytes:
    return bytes([n % 256]) * (size - 4) + n.to_bytes(4, "big")


def test_miss_then_hits(store: CountingStore, tmp_path: Path) -> None:
    data = chunk(1)
    digest = store.add_chunk(data)
    with ChunkCache(tmp_path / "cache", store, 10 * 2**20) as cache:
        assert not cache.contains(digest)
        assert cache.read(digest, 10, 20) == data[10:30]
        assert cache.read(digest, 0, len(data)) == data
        assert cache.read(digest, len(data) - 3, 100) == data[-3:]  # short at the end
        stats = cache.stats()
        assert (stats.misses, stats.hits) == (1, 2)
        assert stats.fetched_bytes == len(data)
        assert (stats.entries, stats.bytes_used) == (1, len(data))
        assert cache.contains(digest)
        assert (tmp_path / "cache" / digest[:2] / digest).read_bytes() == data
    assert store.gets[chunk_key(digest)] == 1


def test_read_cached_never_fetches_or_hashes(store: CountingStore, tmp_path: Path) -> None:
    data = chunk(7)
    digest = store.add_chunk(data)
    with ChunkCache(tmp_path / "cache", store, 10 * 2**20) as cache:
        assert cache.read_cached(digest, 0, 10) is None
        assert store.gets[chunk_key(digest)] == 0
        cache.read(digest, 0, 1)
        assert cache.read_cached(digest, 5, 20) == data[5:25]
    # After a restart the local copy is unverified: only a blocking read may hash it.
    with ChunkCache(tmp_path / "cache", store, 10 * 2**20) as cache:
        assert cache.contains(digest)
        assert cache.read_cached(digest, 0, 10) is None
        assert cache.read(digest, 0, 10) == data[:10]
        assert cache.read_cached(digest, 0, 10) == data[:10]
    assert store.gets[chunk_key(digest)] == 1


def test_bad_digest_and_missing_chunk(store: CountingStore, tmp_path: Path) -> None:
    with ChunkCache(tmp_path / "cache", store, 2**20) as cache:
        with pytest.raises(ValueError):
            cache.read("../../etc/passwd", 0, 1)
        with pytest.raises(ObjectNotFound):
            cache.read("0" * 64, 0, 1)
        assert cache.stats().entries == 0


def test_concurrent_misses_fetch_once(store: CountingStore, tmp_path: Path) -> None:
    data = chunk(2)
    digest = store.add_chunk(data)
    store.delay = 0.3
    n = 16
    barrier = threading.Barrier(n)
    results: list[bytes] = []
    with ChunkCache(tmp_path / "cache", store, 10 * 2**20) as cache:

        def reader(i: int) -> None:
            barrier.wait()
            results.append(cache.read(digest, i * 100, 100))

        threads = [threading.Thread(target=reader, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == sorted(data[i * 100 : i * 100 + 100] for i in range(n))
        assert store.gets[chunk_key(digest)] == 1
        assert cache.stats().misses == n
        assert cache.stats().fetched_bytes == len(data)


def test_corrupt_chunk_is_refused_and_not_cached(store: CountingStore, tmp_path: Path) -> None:
    data = chunk(3)
    digest = hashlib.sha256(data).hexdigest()
    store.put(chunk_key(digest), data[:-1] + b"X")  # bit rot in the store
    cache_dir = tmp_path / "cache"
    with ChunkCache(cache_dir, store, 2**20) as cache:
        for _ in range(2):
            with pytest.raises(CorruptChunk, match=digest):
                cache.read(digest, 0, 10)
        assert not cache.contains(digest)
        assert cache.stats().entries == 0
        assert cache.stats().corrupt == 2
        assert [p for p in cache_dir.rglob("*") if p.is_file()] == []
        # Once the store is repaired, the chunk is served.
        store.put(chunk_key(digest), data)
        assert cache.read(digest, 0, 10) == data[:10]


def test_eviction_keeps_usage_bounded_and_drops_lru_first(
    store: CountingStore, tmp_path: Path
) -> None:
    size = 100 * KIB
    digests = [store.add_chunk(chunk(i, size)) for i in range(12)]
    # Room for 10 chunks; evict above 9, down to 5.
    with ChunkCache(tmp_path / "cache", store, 10 * size, 0.9, 0.5) as cache:
        for d in digests[:9]:
            cache.read(d, 0, 1)
        assert cache.stats().evictions == 0
        cache.read(digests[0], 0, 1)  # 0 is now the most recently used
        cache.read(digests[9], 0, 1)  # the 10th chunk crosses the high mark
        stats = cache.stats()
        assert stats.bytes_used <= 5 * size
        assert stats.evictions == 5
        kept = [i for i, d in enumerate(digests) if cache.contains(d)]
        assert kept == [0, 6, 7, 8, 9]
        for d in digests:
            cache.read(d, 0, 1)
            assert cache.stats().bytes_used <= 10 * size
        # An evicted chunk comes back transparently, fetched again.
        assert not cache.contains(digests[2])
        before = store.gets[chunk_key(digests[2])]
        assert cache.read(digests[2], 0, size) == chunk(2, size)
        assert store.gets[chunk_key(digests[2])] == before + 1
        files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
        assert sum(p.stat().st_size for p in files) == cache.stats().bytes_used


def test_chunks_written_at_once_never_take_the_disk_past_the_high_mark(
    store: CountingStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    size = 100 * KIB
    digests = [store.add_chunk(chunk(i, size)) for i in range(12)]
    cache_dir = tmp_path / "cache"
    on_disk: list[int] = []
    real_replace = os.replace

    def publish(source: str, target: Path) -> None:
        # Every chunk written so far, this one included, just before it is published.
        on_disk.append(sum(p.stat().st_size for p in cache_dir.rglob("*") if p.is_file()))
        real_replace(source, target)

    # Room for 10 chunks; evict above 9, down to 7. Nine fill it to the high mark.
    with ChunkCache(cache_dir, store, 10 * size, 0.9, 0.7) as cache:
        for d in digests[:9]:
            cache.read(d, 0, 1)
        monkeypatch.setattr(chunkcache.os, "replace", publish)
        # Three misses fetched at once: each is written before any of them is counted.
        barrier = threading.Barrier(3)
        for d in digests[9:]:
            store.gate[chunk_key(d)] = threading.Event()
        threads = [
            threading.Thread(target=lambda d=d: (barrier.wait(), cache.read(d, 0, 1)))
            for d in digests[9:]
        ]
        for t in threads:
            t.start()
        for d in digests[9:]:
            store.gate[chunk_key(d)].set()
        for t in threads:
            t.join()
        assert len(on_disk) == 3
        assert max(on_disk) <= 9 * size, on_disk
        assert cache.stats().bytes_used <= 9 * size


def test_an_open_chunk_is_never_evicted(store: CountingStore, tmp_path: Path) -> None:
    size = 100 * KIB
    digests = [store.add_chunk(chunk(i, size)) for i in range(10)]
    with ChunkCache(tmp_path / "cache", store, 3 * size, 0.9, 0.5) as cache:
        handle = cache.open(digests[0])  # the least recently used, but in use
        for d in digests[1:]:
            cache.read(d, 0, 1)
        assert cache.contains(digests[0])
        assert cache.stats().evictions >= 7
        assert handle.read(0, size) == chunk(0, size)
        handle.close()
        for d in digests[:3]:
            cache.read(d, 0, 1)
        assert not cache.contains(digests[9]) or not cache.contains(digests[8])
        assert store.gets[chunk_key(digests[0])] == 1


def test_restart_keeps_chunks_and_drops_leftovers(store: CountingStore, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    good, torn, stray = chunk(4), chunk(5), chunk(6)
    dg, dt, ds = (store.add_chunk(c) for c in (good, torn, stray))
    with ChunkCache(root, store, 2**20) as cache:
        cache.read(dg, 0, 1)
        cache.read(dt, 0, 1)
    # A crash mid-fetch leaves a temp file; a damaged disk leaves a short chunk.
    (root / dg[:2] / ".tmp-abandoned").write_bytes(b"half a chunk")
    (root / dt[:2] / dt).write_bytes(torn[: len(torn) // 2])
    (root / ds[:2]).mkdir(exist_ok=True)
    (root / ds[:2] / ds).write_bytes(b"")
    with ChunkCache(root, store, 2**20) as cache:
        assert not (root / dg[:2] / ".tmp-abandoned").exists()
        assert not (root / ds[:2] / ds).exists()
        assert cache.contains(dg) and cache.contains(dt) and not cache.contains(ds)
        assert cache.stats().bytes_used == len(good) + len(torn) // 2
        # The good chunk is served from disk; the torn one is refetched, never served.
        assert cache.read(dg, 0, len(good)) == good
        assert cache.read(dt, 0, len(torn)) == torn
        assert store.gets[chunk_key(dg)] == 1
        assert store.gets[chunk_key(dt)] == 2
        assert cache.stats().corrupt == 1
        assert cache.stats().bytes_used == len(good) + len(torn)
        assert (root / dt[:2] / dt).read_bytes() == torn


def test_torn_file_with_nothing_in_the_store_is_not_served(
    store: CountingStore, tmp_path: Path
) -> None:
    root = tmp_path / "cache"
    data = chunk(7)
    digest = hashlib.sha256(data).hexdigest()
    (root / digest[:2]).mkdir(parents=True)
    (root / digest[:2] / digest).write_bytes(data[:1000])
    with ChunkCache(root, store, 2**20) as cache:
        with pytest.raises(ObjectNotFound):
            cache.read(digest, 0, 10)
        assert not (root / digest[:2] / digest).exists()


def test_prefetch_fills_the_cache(store: CountingStore, tmp_path: Path) -> None:
    digests = [store.add_chunk(chunk(i)) for i in range(8)]
    with ChunkCache(tmp_path / "cache", store, 10 * 2**20) as cache:
        cache.read(digests[0], 0, 1)
        cache.prefetch(digests)
        assert cache.wait_prefetched(timeout=10)
        assert all(cache.contains(d) for d in digests)
        assert all(store.gets[chunk_key(d)] == 1 for d in digests)
        hits = cache.stats().hits
        assert cache.read(digests[5], 0, 3) == chunk(5)[:3]
        assert cache.stats().hits == hits + 1


def test_prefetch_yields_to_foreground_misses(store: CountingStore, tmp_path: Path) -> None:
    fg, bg = store.add_chunk(chunk(8)), store.add_chunk(chunk(9))
    store.gate[chunk_key(fg)] = gate = threading.Event()
    with ChunkCache(tmp_path / "cache", store, 10 * 2**20) as cache:
        reader = threading.Thread(target=cache.read, args=(fg, 0, 1))
        reader.start()
        while store.gets[chunk_key(fg)] == 0:
            time.sleep(0.01)
        cache.prefetch([bg])
        assert not cache.wait_prefetched(timeout=0.3)
        assert store.gets[chunk_key(bg)] == 0  # held back while the foreground fetch runs
        gate.set()
        reader.join()
        assert cache.wait_prefetched(timeout=10)
        assert cache.contains(bg)


def test_prefetch_does_not_push_out_the_working_set(store: CountingStore, tmp_path: Path) -> None:
    size = 100 * KIB
    digests = [store.add_chunk(chunk(i, size)) for i in range(10)]
    with ChunkCache(tmp_path / "cache", store, 10 * size, 0.9, 0.5) as cache:
        cache.prefetch(digests)
        assert cache.wait_prefetched(timeout=10)
        assert cache.stats().evictions == 0
        assert cache.stats().entries == 5


def test_cache_from_config(store: CountingStore, tmp_path: Path) -> None:
    cfg = load_config(env={"AENV_HOME": str(tmp_path), "AENV_CACHE_MAX_BYTES": "1048576"})
    assert cfg.cache.max_bytes == 2**20
    with open_chunk_cache(cfg, store) as cache:
        assert cache.root == tmp_path / "cache"
        assert cache.max_bytes == 2**20


def test_many_threads_on_a_small_cache_always_read_the_right_bytes(
    store: CountingStore, tmp_path: Path
) -> None:
    size = 64 * KIB
    chunks = [chunk(i, size) for i in range(20)]
    digests = [store.add_chunk(c) for c in chunks]
    errors: list[str] = []
    with ChunkCache(tmp_path / "cache", store, 6 * size, 0.9, 0.5) as cache:
        cache.prefetch(digests)

        def worker(seed: int) -> None:
            for step in range(200):
                i = (seed * 7 + step * 13) % len(digests)
                offset = (step * 4099) % size
                try:
                    got = cache.read(digests[i], offset, 100)
                except Exception as exc:
                    errors.append(repr(exc))
                    continue
                if got != chunks[i][offset : offset + 100]:
                    errors.append(f"chunk {i} offset {offset}")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert cache.wait_prefetched(timeout=10)
        assert errors == []
        stats = cache.stats()
        assert stats.hits + stats.misses == 8 * 200
        assert stats.bytes_used <= 6 * size
        files = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
        assert sorted(p.name for p in files) == sorted(d for d in digests if cache.contains(d))
