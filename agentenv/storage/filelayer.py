"""Files as block layers: a local file (guest RAM, a qcow2 disk, device state) stored over
the layer of its previous version, so only the blocks that changed are written, and any
layer written back as a sparse file on any node.

Each layer also stores the digests of every block of the file it describes
(`digests/<layer id>`, 16 bytes a block, zeros for a hole), so the next version is diffed
against it without reading the old content back.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .layer import BLOCK_SIZE, LayerIndex, LayerWriter, Stack, chain_id, chunk_key, layer_key
from .objectstore import ObjectNotFound, ObjectStore, ObjectStoreError

_DIGEST = 16
_HOLE = bytes(_DIGEST)
_ZERO_BLOCK = bytes(BLOCK_SIZE)


class LayerMissing(ObjectStoreError):
    """A layer, or a layer it sits on, is not in the object store."""


def digests_key(layer_id: str) -> str:
    return f"digests/{layer_id}"


def _block_digest(data: bytes) -> bytes:
    if data == _ZERO_BLOCK:
        return _HOLE
    return hashlib.blake2b(data, digest_size=_DIGEST).digest()


def _read_blocks(path: Path) -> tuple[int, dict[int, bytes]]:
    """The file's size and the data of each block not wholly inside a hole."""
    blocks: dict[int, bytes] = {}
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            for block in range(start // BLOCK_SIZE, -(-end // BLOCK_SIZE)):
                if block not in blocks:
                    data = os.pread(fd, BLOCK_SIZE, block * BLOCK_SIZE)
                    blocks[block] = data.ljust(BLOCK_SIZE, b"\0")
            pos = end
    return size, blocks


def store_file(store: ObjectStore, path: Path, parent: str | None) -> tuple[str, int]:
    """Store `path` as a layer over `parent` (a layer of an earlier version, or None);
    returns the layer's id and the bytes of blocks it wrote. A layer already stored
    for the same content over the same parent is reused."""
    size, blocks = _read_blocks(path)
    count = -(-size // BLOCK_SIZE)
    old = _digests(store, parent) if parent else b""
    digests = bytearray(count * _DIGEST)
    changed: list[int] = []
    for block in range(count):
        data = blocks.get(block)
        digest = _HOLE if data is None else _block_digest(data)
        digests[block * _DIGEST : (block + 1) * _DIGEST] = digest
        if digest != old[block * _DIGEST : (block + 1) * _DIGEST].ljust(_DIGEST, b"\0"):
            changed.append(block)
    layer_id = chain_id(parent, f"{size}:{hashlib.sha256(digests).hexdigest()}")
    if store.exists(layer_key(layer_id)):
        return layer_id, 0
    writer = LayerWriter(store, layer_id, parent, size)
    for block in changed:
        writer.add_block(block, blocks.get(block, _ZERO_BLOCK))
    # The digests first: a visible index (written by `finish`) always has them.
    store.put(digests_key(layer_id), bytes(digests))
    writer.finish()
    return layer_id, len(changed) * BLOCK_SIZE


def _digests(store: ObjectStore, layer_id: str) -> bytes:
    try:
        return store.get(digests_key(layer_id))
    except ObjectNotFound:
        raise LayerMissing(f"layer {layer_id} has no block digests in the store") from None


def load_chain(store: ObjectStore, top: str) -> Stack:
    """The stack that ends in `top`, found by following each layer's parent."""
    layers: list[LayerIndex] = []
    layer_id: str | None = top
    while layer_id is not None:
        try:
            index = LayerIndex.from_json(store.get(layer_key(layer_id)))
        except ObjectNotFound:
            raise LayerMissing(f"layer {layer_id} is not in the object store") from None
        layers.append(index)
        layer_id = index.parent
    return Stack(layers[::-1])


def materialize(stack: Stack, store: ObjectStore, dest: Path) -> None:
    """Write the stack's whole content to `dest` as a sparse file (absent blocks: holes)."""
    by_chunk: dict[str, list[tuple[int, int]]] = {}
    for block in range(-(-stack.size // BLOCK_SIZE)):
        ref = stack.lookup(block)
        if ref is not None:
            by_chunk.setdefault(ref.chunk, []).append((block, ref.offset))
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, stack.size)
        for digest, blocks in by_chunk.items():
            data = store.get(chunk_key(digest))
            if hashlib.sha256(data).hexdigest() != digest:
                raise ObjectStoreError(f"materialize {stack.top}: chunk {digest} is corrupt")
            view = memoryview(data)
            for block, offset in blocks:
                piece = view[offset : offset + BLOCK_SIZE]
                if piece != _ZERO_BLOCK:
                    # The last block may run past the file's end: keep the size exact.
                    length = min(BLOCK_SIZE, stack.size - block * BLOCK_SIZE)
                    os.pwrite(fd, piece[:length], block * BLOCK_SIZE)
        os.fsync(fd)
    finally:
        os.close(fd)
