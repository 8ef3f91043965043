"""The step cache's bound: which entries go when their bytes pass it (least recently
built from first), so template builds never fill a node's disk."""

from __future__ import annotations

from .snapshots import BUILD_CACHE, SnapshotRecord


def over_bound(records: list[SnapshotRecord], max_bytes: int, keep: str) -> list[SnapshotRecord]:
    """The cache entries among `records` to delete, least recently used first, for the rest
    to fit in `max_bytes`; never `keep` (the entry just taken)."""
    entries = sorted((r for r in records if r.kind == BUILD_CACHE), key=lambda r: r.last_used)
    total = sum(entry.size for entry in entries)
    evicted = []
    for entry in entries:
        if total <= max_bytes:
            break
        if entry.snapshot_id == keep:
            continue
        evicted.append(entry)
        total -= entry.size
    return evicted
