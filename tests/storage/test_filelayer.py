"""Files as layers: only changed blocks are written, and any version reads back exactly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentenv.storage.filelayer import (
    MAX_CHAIN,
    LayerMissing,
    load_chain,
    materialize,
    store_file,
)
from agentenv.storage.layer import BLOCK_SIZE
from agentenv.storage.posix import PosixObjectStore


def _sparse(path: Path, size: int, writes: dict[int, bytes]) -> None:
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in writes.items():
            f.seek(offset)
            f.write(data)


def _restored(store: PosixObjectStore, layer_id: str, dest: Path) -> bytes:
    materialize(load_chain(store, layer_id), store, dest)
    return dest.read_bytes()


def test_versions_store_only_what_changed(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    ram = tmp_path / "memory"
    size = 64 * BLOCK_SIZE + 100  # a tail block shorter than a block
    _sparse(ram, size, {0: os.urandom(3 * BLOCK_SIZE), 40 * BLOCK_SIZE: b"x" * 10})
    first, written = store_file(store, ram, None)
    assert written == 4 * BLOCK_SIZE  # blocks 0-2 and 40; holes are not stored
    v1 = ram.read_bytes()

    # One block rewritten, one zeroed, the short tail written: three blocks change.
    with open(ram, "r+b") as f:
        f.seek(BLOCK_SIZE + 7)
        f.write(b"changed")
        f.seek(40 * BLOCK_SIZE)
        f.write(bytes(10))
        f.seek(size - 50)
        f.write(b"t" * 50)
    second, written = store_file(store, ram, first)
    assert written == 3 * BLOCK_SIZE
    v2 = ram.read_bytes()

    assert _restored(store, first, tmp_path / "a") == v1
    assert _restored(store, second, tmp_path / "b") == v2
    # The same content over the same parent is the same layer, written once.
    assert store_file(store, ram, first) == (second, 0)
    # Holes stay holes when written back.
    assert os.stat(tmp_path / "b").st_blocks * 512 < 8 * BLOCK_SIZE


def test_a_file_that_grew_or_shrank(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    disk = tmp_path / "disk"
    _sparse(disk, 10 * BLOCK_SIZE, {0: b"a" * BLOCK_SIZE, 9 * BLOCK_SIZE: b"z" * BLOCK_SIZE})
    first, _ = store_file(store, disk, None)
    _sparse(disk, 4 * BLOCK_SIZE, {0: b"a" * BLOCK_SIZE, 3 * BLOCK_SIZE: b"q"})
    second, _ = store_file(store, disk, first)
    assert _restored(store, second, tmp_path / "b") == disk.read_bytes()


def test_a_missing_layer_is_named(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    (tmp_path / "f").write_bytes(b"x" * 10)
    with pytest.raises(LayerMissing):
        store_file(store, tmp_path / "f", "0" * 64)
    with pytest.raises(LayerMissing):
        load_chain(store, "0" * 64)


def test_page_sized_blocks_for_guest_ram(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    ram = tmp_path / "memory"
    _sparse(ram, 1 << 20, {0: os.urandom(1 << 20)})
    first, _ = store_file(store, ram, None, block_size=4096)
    with open(ram, "r+b") as f:
        for page in (3, 100, 200):
            f.seek(page * 4096 + 5)
            f.write(b"dirty")
    second, written = store_file(store, ram, first, block_size=4096)
    assert written == 3 * 4096
    assert _restored(store, second, tmp_path / "back") == ram.read_bytes()
    # A parent of another block size is not diffed against: the file is stored whole.
    third, written = store_file(store, ram, second)
    assert written == 1 << 20 and load_chain(store, third).block_size == BLOCK_SIZE


def test_long_chains_start_again(tmp_path: Path) -> None:
    store = PosixObjectStore(tmp_path / "objects")
    ram = tmp_path / "memory"
    _sparse(ram, 64 * 4096, {0: os.urandom(64 * 4096)})
    layer, _ = store_file(store, ram, None, block_size=4096)
    depths = []
    for version in range(2 * MAX_CHAIN):
        with open(ram, "r+b") as f:
            f.seek((version % 64) * 4096)
            f.write(os.urandom(16))
        layer, _ = store_file(store, ram, layer, block_size=4096)
        depths.append(load_chain(store, layer).depth)
    assert max(depths) == MAX_CHAIN and min(depths) == 1
    assert _restored(store, layer, tmp_path / "back") == ram.read_bytes()
