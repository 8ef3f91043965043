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
# Most layers one file's chain holds before an upload stores the whole file again.
MAX_CHAIN = 16
_HOLE = bytes(_DIGEST)
# Data is read in windows of this many bytes, then cut into blocks.
_WINDOW = 4 * 1024 * 1024


class LayerMissing(ObjectStoreError):
    """A layer, or a layer it sits on, is not in the object store."""


def digests_key(layer_id: str) -> str:
    return f"digests/{layer_id}"


def _block_digests(path: Path, block_size: int) -> tuple[int, bytearray]:
    """The file's size and a digest per block (zeros for holes and zero blocks), read in
    windows so memory stays bounded whatever the file's size."""
    with open(path, "rb") as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        count = -(-size // block_size)
        digests = bytearray(count * _DIGEST)
        zero = bytes(block_size)
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            first, last = start // block_size, -(-end // block_size)
            for window in range(first, last, _WINDOW // block_size):
                blocks = min(_WINDOW // block_size, last - window)
                data = os.pread(fd, blocks * block_size, window * block_size)
                for i in range(blocks):
                    piece = data[i * block_size : (i + 1) * block_size].ljust(block_size, b"\0")
                    if piece != zero:
                        at = (window + i) * _DIGEST
                        digests[at : at + _DIGEST] = hashlib.blake2b(
                            piece, digest_size=_DIGEST
                        ).digest()
            pos = end
    return size, digests


def store_file(
    store: ObjectStore, path: Path, parent: str | None, block_size: int = BLOCK_SIZE
) -> tuple[str, int]:
    """Store `path` as a layer of `block_size` blocks over `parent` (a layer of an earlier
    version, or None); returns the layer's id and the bytes of blocks it wrote. A layer
    already stored for the same content over the same parent is reused. A chain that
    reached MAX_CHAIN layers starts again with the whole file, so reading one back never
    walks more layers than that. The file must not change meanwhile (it is read twice)."""
    size, digests = _block_digests(path, block_size)
    depth, old = _digests(store, parent, block_size) if parent else (0, b"")
    if parent and (not old or depth + 1 >= MAX_CHAIN):
        # Other blocks, or a chain long enough: the whole file (unchanged runs of it
        # pack into chunks that are stored already).
        parent, depth, old = None, 0, b""
    elif parent:
        depth += 1
    changed = [
        block
        for block in range(len(digests) // _DIGEST)
        if digests[block * _DIGEST : (block + 1) * _DIGEST]
        != old[block * _DIGEST : (block + 1) * _DIGEST].ljust(_DIGEST, b"\0")
    ]
    content = f"{size}:{block_size}:{hashlib.sha256(digests).hexdigest()}"
    layer_id = chain_id(parent, content)
    if store.exists(layer_key(layer_id)):
        return layer_id, 0
    writer = LayerWriter(store, layer_id, parent, size, block_size)
    with open(path, "rb") as f:
        for block in changed:
            data = os.pread(f.fileno(), block_size, block * block_size)
            writer.add_block(block, data.ljust(block_size, b"\0"))
    # The digests first: a visible index (written by `finish`) always has them.
    header = block_size.to_bytes(4, "big") + depth.to_bytes(4, "big")
    store.put(digests_key(layer_id), header + bytes(digests))
    writer.finish()
    return layer_id, len(changed) * block_size


def _digests(store: ObjectStore, layer_id: str, block_size: int) -> tuple[int, bytes]:
    """A layer's depth in its chain and the block digests of its whole file (none if its
    blocks have another size)."""
    try:
        data = store.get(digests_key(layer_id))
    except ObjectNotFound:
        raise LayerMissing(f"layer {layer_id} has no block digests in the store") from None
    depth = int.from_bytes(data[4:8], "big")
    if int.from_bytes(data[:4], "big") != block_size:
        return depth, b""
    return depth, data[8:]


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


def _runs(blocks: list[tuple[int, int]], block_size: int) -> list[tuple[int, int, int]]:
    """(first block, offset in the chunk, count) for each run of blocks that follow each
    other both in the file and in the chunk, so each run is one write."""
    runs: list[tuple[int, int, int]] = []
    for block, offset in blocks:
        if runs:
            first, start, count = runs[-1]
            if block == first + count and offset == start + count * block_size:
                runs[-1] = (first, start, count + 1)
                continue
        runs.append((block, offset, 1))
    return runs


def materialize(stack: Stack, store: ObjectStore, dest: Path, durable: bool = False) -> None:
    """Write the stack's whole content to `dest` as a sparse file (absent blocks: holes);
    `durable`: on disk before this returns (a scratch or cache file need not be)."""
    block_size = stack.block_size
    by_chunk: dict[str, list[tuple[int, int]]] = {}
    for block in range(-(-stack.size // block_size)):
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
            for block, offset, count in _runs(blocks, block_size):
                piece = view[offset : offset + count * block_size]
                if piece == bytes(len(piece)):
                    continue  # zeros stay a hole
                # The last block may run past the file's end: keep the size exact.
                length = min(len(piece), stack.size - block * block_size)
                os.pwrite(fd, piece[:length], block * block_size)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
