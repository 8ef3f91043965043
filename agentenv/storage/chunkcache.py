"""A bounded local cache of content-addressed chunks in front of an ObjectStore.

Chunks are fetched whole, once per concurrent miss, verified against their sha256 before
they are published (temp file, fsync, rename to `<root>/<digest[:2]>/<digest>`), and
evicted least-recently-used first between two water marks. Everything in the cache also
exists in the store, so any entry not being read may be evicted.

After a restart the index is rebuilt by scanning `root`. Files found there are indexed as
*unverified*: a chunk's size is not known without its layer index, and hashing a full
cache would delay start by seconds per GiB, so each such chunk is hashed on its first read
instead, and a mismatching (torn, truncated, tampered) file is deleted and re-fetched.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .layer import chunk_key
from .objectstore import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

_DIGEST = re.compile(r"[0-9a-f]{64}")
_TEMP_PREFIX = ".tmp-"


class CorruptChunk(ObjectStoreError):
    """The store returned bytes whose sha256 is not the chunk's digest."""


@dataclass(frozen=True)
class CacheStats:
    """Counters since construction; a hit is a read that found the chunk locally."""

    hits: int
    misses: int
    fetched_bytes: int
    evictions: int
    bytes_used: int
    entries: int
    corrupt: int


@dataclass
class _Entry:
    size: int
    verified: bool
    opens: int = 0


class _Flight:
    """One fetch (or first-read verification) in progress; others wait on `done`."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


def _check_digest(digest: str) -> None:
    # The digest becomes a path: only accept what a sha256 hex digest looks like.
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")


class ChunkHandle:
    """An open chunk: pinned against eviction until closed."""

    def __init__(self, cache: ChunkCache, digest: str, entry: _Entry, fd: int) -> None:
        self.digest = digest
        self.size = entry.size
        self._cache, self._entry, self._fd = cache, entry, fd

    def read(self, offset: int, length: int) -> bytes:
        """`length` bytes from `offset` (fewer only at the end of the chunk)."""
        if offset < 0 or length < 0:
            raise ValueError(f"bad range offset={offset} length={length}")
        parts: list[bytes] = []
        done = 0
        while done < length:
            part = os.pread(self._fd, length - done, offset + done)
            if not part:
                break
            parts.append(part)
            done += len(part)
        return b"".join(parts)

    def read_and_close(self, offset: int, length: int) -> bytes:
        try:
            return self.read(offset, length)
        finally:
            self.close()

    def close(self) -> None:
        if self._fd < 0:
            return
        os.close(self._fd)
        self._fd = -1
        self._cache._release(self._entry)

    def __enter__(self) -> ChunkHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ChunkCache:
    """Thread-safe cache of chunks `chunks/<sha256>` from `store`, bounded by `max_bytes`."""

    def __init__(
        self,
        root: Path | str,
        store: ObjectStore,
        max_bytes: int,
        high_water: float = 0.9,
        low_water: float = 0.7,
    ) -> None:
        if max_bytes <= 0 or not 0 < low_water <= high_water <= 1:
            raise ValueError("need max_bytes > 0 and 0 < low_water <= high_water <= 1")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._store = store
        self.max_bytes = max_bytes
        self._high = high_water * max_bytes
        self._low = low_water * max_bytes
        self._lock = threading.Lock()
        # Notified when a foreground fetch ends or prefetch work is done.
        self._changed = threading.Condition(self._lock)
        # Insertion order is recency: oldest first, moved to the end on every access.
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._flights: dict[str, _Flight] = {}
        self._foreground = 0
        self._used = 0
        # Bytes of fetched chunks being written: on disk before they are entries.
        self._reserved = 0
        self._hits = self._misses = self._fetched = self._evictions = self._corrupt = 0
        self._closed = False
        self._prefetch_queue: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._prefetch_pending = 0
        self._prefetcher: threading.Thread | None = None
        self._scan()
        with self._lock:
            self._evict_locked()

    # -- public API ---------------------------------------------------------------------

    def read(self, digest: str, offset: int, length: int) -> bytes:
        """Bytes of chunk `digest`, fetched whole and verified on a miss."""
        return self.open(digest).read_and_close(offset, length)

    def open(self, digest: str) -> ChunkHandle:
        """Pin chunk `digest` locally (fetching it on a miss) for several reads."""
        _check_digest(digest)
        counted = False
        while True:
            entry = self._acquire(digest, counted)
            counted = True
            try:
                fd = os.open(self._path(digest), os.O_RDONLY)
            except FileNotFoundError:
                # Removed behind our back (by hand, or a full disk cleaner): fetch again.
                with self._lock:
                    entry.opens -= 1
                    if self._entries.get(digest) is entry:
                        self._remove_locked(digest, unlink=False)
                continue
            except BaseException:
                self._release(entry)
                raise
            return ChunkHandle(self, digest, entry, fd)

    def read_cached(self, digest: str, offset: int, length: int) -> bytes | None:
        """The bytes if chunk `digest` is held and verified, else None: never fetches or
        hashes, so a caller may try it where blocking on the network is not allowed."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None or not entry.verified:
                return None
            entry.opens += 1
            self._entries.move_to_end(digest)
            self._hits += 1
        try:
            fd = os.open(self._path(digest), os.O_RDONLY)
        except FileNotFoundError:
            self._release(entry)
            return None
        return ChunkHandle(self, digest, entry, fd).read_and_close(offset, length)

    def contains(self, digest: str) -> bool:
        """Whether the chunk is held locally (possibly not yet verified after a restart)."""
        with self._lock:
            return digest in self._entries

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self._hits, self._misses, self._fetched, self._evictions,
                self._used, len(self._entries), self._corrupt,
            )  # fmt: skip

    def prefetch(self, digests: Iterable[str]) -> None:
        """Queue chunks to fetch in the background, behind every foreground miss."""
        digests = list(digests)
        for digest in digests:
            _check_digest(digest)
        with self._lock:
            if self._closed:
                return
            self._prefetch_pending += len(digests)
            if self._prefetcher is None:
                self._prefetcher = threading.Thread(
                    target=self._prefetch_loop, name="chunk-prefetch", daemon=True
                )
                self._prefetcher.start()
        for digest in digests:
            self._prefetch_queue.put(digest)

    def wait_prefetched(self, timeout: float | None = None) -> bool:
        """Wait until the prefetch queue is empty; False on timeout."""
        with self._lock:
            return self._changed.wait_for(lambda: self._prefetch_pending == 0, timeout)

    def close(self) -> None:
        """Stop the prefetcher; later reads fail."""
        with self._lock:
            self._closed = True
            thread = self._prefetcher
            self._changed.notify_all()
        if thread is not None:
            self._prefetch_queue.put(None)
            thread.join(timeout=30)

    def __enter__(self) -> ChunkCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lookup, fetch, publish ---------------------------------------------------------

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    def _acquire(self, digest: str, counted: bool, foreground: bool = True) -> _Entry:
        """A verified entry with its open count raised, fetching or verifying it first."""
        while True:
            with self._lock:
                if self._closed:
                    raise ObjectStoreError(f"chunk cache {self.root} is closed")
                entry = self._entries.get(digest)
                if not counted:
                    counted = True
                    if entry is not None:
                        self._hits += 1
                    else:
                        self._misses += 1
                if entry is not None and entry.verified:
                    entry.opens += 1
                    self._entries.move_to_end(digest)
                    return entry
                flight = self._flights.get(digest)
                lead = flight is None
                if lead:
                    flight = self._flights[digest] = _Flight()
                    if foreground:
                        self._foreground += 1
            assert flight is not None
            if not lead:
                flight.done.wait()
                if flight.error is not None:
                    raise flight.error
                continue  # normally a hit now; if evicted meanwhile, go round again
            try:
                return self._fill(digest, flight)
            finally:
                if foreground:
                    with self._lock:
                        self._foreground -= 1
                        self._changed.notify_all()

    def _fill(self, digest: str, flight: _Flight) -> _Entry:
        """Make `digest` a verified entry: check an unverified local copy, else fetch it."""
        try:
            size = self._verify_local(digest)
            fetched = size is None
            if size is None:
                size = self._fetch_and_publish(digest)
        except BaseException as exc:
            with self._lock:
                flight.error = exc
                del self._flights[digest]
                flight.done.set()
            raise
        with self._lock:
            old = self._entries.pop(digest, None)
            if old is not None:
                self._used -= old.size
            # Pinned for the caller, so eviction below cannot take it first.
            entry = _Entry(size, verified=True, opens=1)
            self._entries[digest] = entry
            self._used += size
            if fetched:
                self._reserved -= size
                self._fetched += size
            del self._flights[digest]
            flight.done.set()
            self._evict_locked()
        return entry

    def _verify_local(self, digest: str) -> int | None:
        """Size of an unverified local copy that hashes right; a bad copy is deleted."""
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
        # Safe without the lock: eviction skips chunks with a flight, and we hold it.
        try:
            data = self._path(digest).read_bytes()
        except OSError:
            data = None
        if data is not None and hashlib.sha256(data).hexdigest() == digest:
            return len(data)
        log.warning("cached chunk %s is damaged; fetching it again", digest)
        with self._lock:
            self._corrupt += 1
            if digest in self._entries:
                self._remove_locked(digest, unlink=True)
        return None

    def _fetch_and_publish(self, digest: str) -> int:
        data = self._store.get(chunk_key(digest))
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            with self._lock:
                self._corrupt += 1
            raise CorruptChunk(
                f"chunk {digest}: the store returned {len(data)} bytes hashing to {actual}"
            )
        # Room first: chunks written at once must not take the disk past the limit
        # before any of them is counted. `_fill` turns the reservation into usage.
        with self._lock:
            self._reserved += len(data)
            self._evict_locked()
        folder = self.root / digest[:2]
        try:
            folder.mkdir(exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=_TEMP_PREFIX)
        except BaseException:
            with self._lock:
                self._reserved -= len(data)
            raise
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                # Before the rename: a crash must never leave a short file under the digest.
                os.fsync(out.fileno())
            os.replace(tmp, self._path(digest))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            with self._lock:
                self._reserved -= len(data)
            raise
        return len(data)

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.opens -= 1
            # Pinned chunks may have held usage above the high mark; retry now.
            if entry.opens == 0 and self._used + self._reserved > self._high:
                self._evict_locked()

    # -- eviction and the on-disk index -------------------------------------------------

    def _remove_locked(self, digest: str, unlink: bool) -> None:
        entry = self._entries.pop(digest)
        self._used -= entry.size
        if unlink:
            # Under the lock, so a concurrent re-fetch cannot publish before this unlink.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(digest))

    def _evict_locked(self) -> None:
        """Above the high mark (counting chunks being written), drop least-recently-used
        idle chunks down to the low mark."""
        if self._used + self._reserved <= self._high:
            return
        for digest, entry in list(self._entries.items()):
            if self._used + self._reserved <= self._low:
                break
            if entry.opens > 0 or digest in self._flights:
                continue
            self._remove_locked(digest, unlink=True)
            self._evictions += 1

    def _scan(self) -> None:
        """Rebuild the index from `root`: temp files and strays go, chunks stay unverified."""
        found: list[tuple[float, str, int]] = []
        for folder in self.root.iterdir():
            if not (folder.is_dir() and re.fullmatch(r"[0-9a-f]{2}", folder.name)):
                continue
            for path in folder.iterdir():
                name = path.name
                if path.is_dir():
                    continue
                st = path.stat()
                # Temp files are unfinished fetches; no chunk is empty, so a zero-length
                # file is a torn write; anything else misnamed is not ours to keep.
                if (
                    name.startswith(_TEMP_PREFIX)
                    or not _DIGEST.fullmatch(name)
                    or name[:2] != folder.name
                    or st.st_size == 0
                ):
                    log.info("removing leftover %s from the chunk cache", path)
                    with contextlib.suppress(OSError):
                        path.unlink()
                    continue
                found.append((st.st_mtime, name, st.st_size))
        # Last access is not kept on disk; publication time orders the rebuilt LRU.
        for _, digest, size in sorted(found):
            self._entries[digest] = _Entry(size, verified=False)
            self._used += size

    # -- background prefetch ------------------------------------------------------------

    def _prefetch_loop(self) -> None:
        while True:
            digest = self._prefetch_queue.get()
            if digest is None:
                return
            try:
                self._prefetch_one(digest)
            except Exception as exc:  # a prefetch failure only costs a later miss
                log.warning("prefetch of chunk %s failed: %s", digest, exc)
            finally:
                with self._lock:
                    self._prefetch_pending -= 1
                    self._changed.notify_all()

    def _prefetch_one(self, digest: str) -> None:
        with self._lock:
            # Yield to foreground misses: start nothing while one is being fetched.
            self._changed.wait_for(lambda: self._foreground == 0 or self._closed)
            if self._closed or digest in self._entries or digest in self._flights:
                return
            # Prefetch fills free room only; it never pushes the working set out.
            if self._used >= self._low:
                return
        self._release(self._acquire(digest, counted=True, foreground=False))
