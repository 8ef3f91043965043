"""Block layers: writing, the index's JSON round trip, and stacking."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from agentenv.storage.chunkcache import ChunkCache
from agentenv.storage.layer import (
    BLOCK_SIZE,
    CHUNK_TARGET,
    BlockRef,
    LayerIndex,
    LayerWriter,
    Stack,
    chain_id,
    chunk_key,
    layer_key,
)
from agentenv.storage.posix import PosixObjectStore

BLOCKS_PER_CHUNK = CHUNK_TARGET // BLOCK_SIZE
DISK = 1024 * BLOCK_SIZE


def block(tag: int) -> bytes:
    return tag.to_bytes(4, "big") * (BLOCK_SIZE // 4)


def write_layer(
    store: PosixObjectStore, parent: str | None, blocks: dict[int, bytes], diff: str
) -> LayerIndex:
    writer = LayerWriter(store, chain_id(parent, diff), parent, DISK)
    for number, data in blocks.items():
        writer.add_block(number, data)
    return writer.finish()


def read_block(store: PosixObjectStore, stack: Stack, number: int) -> bytes:
    ref = stack.lookup(number)
    if ref is None:
        return bytes(BLOCK_SIZE)
    return store.get_range(chunk_key(ref.chunk), ref.offset, BLOCK_SIZE)


def test_writer_packs_blocks_into_verified_chunks(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path)
    blocks = {i * 3: block(i) for i in range(BLOCKS_PER_CHUNK + 5)}
    index = write_layer(store, None, blocks, "diff-a")
    chunks = store.list("chunks/")
    assert len(chunks) == 2  # one full chunk, then the remainder
    for key in chunks:
        data = store.get(key)
        assert key == chunk_key(hashlib.sha256(data).hexdigest())
        assert len(data) <= CHUNK_TARGET
    for number, data in blocks.items():
        ref = index.blocks[number]
        assert store.get_range(chunk_key(ref.chunk), ref.offset, BLOCK_SIZE) == data
    assert LayerIndex.from_json(store.get(layer_key(index.layer_id))) == index


def test_identical_chunks_are_stored_once(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path)
    a = write_layer(store, None, {0: block(1), 1: block(2)}, "a")
    b = write_layer(store, None, {0: block(1), 1: block(2)}, "b")
    assert a.layer_id != b.layer_id
    assert a.blocks == b.blocks
    assert len(store.list("chunks/")) == 1


def test_index_json_round_trip_and_format_check() -> None:
    index = LayerIndex("id", "parent", DISK, {5: BlockRef("c" * 64, 0), 9: BlockRef("d" * 64, 7)})
    assert LayerIndex.from_json(index.to_json()) == index
    bad = index.to_json().replace(b'"format":1', b'"format":99')
    with pytest.raises(ValueError, match="unsupported"):
        LayerIndex.from_json(bad)


def test_stack_resolves_each_block_to_the_topmost_layer(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path)
    base = write_layer(store, None, {0: block(10), 1: block(11), 2: block(12)}, "base")
    upper = write_layer(store, base.layer_id, {1: block(21), 5: block(25)}, "upper")
    stack = Stack([base, upper])
    assert stack.top == upper.layer_id
    assert stack.size == DISK
    assert read_block(store, stack, 0) == block(10)
    assert read_block(store, stack, 1) == block(21)
    assert read_block(store, stack, 5) == block(25)
    assert read_block(store, stack, 7) == bytes(BLOCK_SIZE)  # never written: zeros
    assert stack.chunks() == {r.chunk for r in base.blocks.values()} | {
        r.chunk for r in upper.blocks.values()
    }


def test_stack_refuses_misordered_layers(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path)
    base = write_layer(store, None, {0: block(1)}, "base")
    upper = write_layer(store, base.layer_id, {0: block(2)}, "upper")
    with pytest.raises(ValueError):
        Stack([upper, base])
    with pytest.raises(ValueError):
        Stack([])


def test_writer_refuses_short_blocks(tmp_path: Path) -> None:
    writer = LayerWriter(PosixObjectStore(tmp_path), "id", None, DISK)
    with pytest.raises(ValueError):
        writer.add_block(0, b"short")


def test_blocks_read_through_the_chunk_cache(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "store")
    base = write_layer(store, None, {i: block(i) for i in range(10)}, "base")
    stack = Stack([base])
    with ChunkCache(tmp_path / "cache", store, 64 * 2**20) as cache:
        cache.prefetch(stack.chunks())
        assert cache.wait_prefetched(timeout=10)
        for i in range(10):
            ref = stack.lookup(i)
            assert ref is not None
            assert cache.read(ref.chunk, ref.offset, BLOCK_SIZE) == block(i)
        assert cache.stats().misses == 0
