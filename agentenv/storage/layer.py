"""Block layers: an image's disk as a stack of immutable, content-addressed block diffs.

A disk is a raw image of `size` bytes, cut into blocks of BLOCK_SIZE. A layer records
the blocks its change wrote; a block absent from every layer of a stack reads as zeros.
Block data lives in content-addressed chunks (objects `chunks/<sha256>`, up to
CHUNK_TARGET bytes, several blocks each), so identical data is stored once and any block
can be fetched without the rest of its layer. A layer's index is the object
`layers/<layer_id>.json`; `layer_id` is a chain id (hash of the parent's id and the
source diff's digest), so one layer converted over one parent is stored once.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field

from .objectstore import ObjectStore

BLOCK_SIZE = 64 * 1024
# Layers of guest RAM use the guest's page size: a page written here and there would
# otherwise store a whole 64 KiB block each.
BLOCK_SIZES = frozenset({4096, BLOCK_SIZE})
CHUNK_TARGET = 4 * 1024 * 1024


def chunk_key(digest: str) -> str:
    """Object key of a chunk; `digest` is the hex sha256 of its bytes."""
    return f"chunks/{digest}"


def layer_key(layer_id: str) -> str:
    return f"layers/{layer_id}.json"


_FORMAT = 1


def chain_id(parent: str | None, diff_digest: str) -> str:
    """Identity of a layer: the same diff applied over the same parent is the same layer."""
    return hashlib.sha256(f"{parent or ''}\n{diff_digest}".encode()).hexdigest()


@dataclass(frozen=True)
class BlockRef:
    """Where one block's bytes are: inside chunk `chunk` (sha256 hex) at `offset`."""

    chunk: str
    offset: int


@dataclass
class LayerIndex:
    layer_id: str
    parent: str | None
    size: int
    blocks: dict[int, BlockRef] = field(default_factory=dict)
    block_size: int = BLOCK_SIZE

    def to_json(self) -> bytes:
        chunks = sorted({ref.chunk for ref in self.blocks.values()})
        number = {digest: i for i, digest in enumerate(chunks)}
        rows = [[b, number[r.chunk], r.offset] for b, r in sorted(self.blocks.items())]
        return json.dumps(
            {
                "format": _FORMAT,
                "layer_id": self.layer_id,
                "parent": self.parent,
                "size": self.size,
                "block_size": self.block_size,
                "chunks": chunks,
                "blocks": rows,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LayerIndex:
        doc = json.loads(data)
        if doc.get("format") != _FORMAT or doc.get("block_size") not in BLOCK_SIZES:
            raise ValueError(f"unsupported layer index format in {doc.get('layer_id')}")
        chunks = doc["chunks"]
        blocks = {b: BlockRef(chunks[c], off) for b, c, off in doc["blocks"]}
        return cls(doc["layer_id"], doc["parent"], doc["size"], blocks, doc["block_size"])


class Stack:
    """Layers bottom to top; each block resolves to the topmost layer that wrote it."""

    def __init__(self, layers: list[LayerIndex]) -> None:
        if not layers:
            raise ValueError("a stack needs at least one layer")
        for lower, upper in itertools.pairwise(layers):
            if upper.parent != lower.layer_id:
                raise ValueError(f"layer {upper.layer_id} does not sit on {lower.layer_id}")
            if upper.block_size != lower.block_size:
                raise ValueError(f"layer {upper.layer_id} has another block size than its parent")
        self.size = layers[-1].size
        self.block_size = layers[-1].block_size
        self.depth = len(layers)
        self.top = layers[-1].layer_id
        self.layer_ids = [layer.layer_id for layer in layers]
        merged: dict[int, BlockRef] = {}
        for layer in layers:
            merged.update(layer.blocks)
        self._blocks = merged

    def lookup(self, block: int) -> BlockRef | None:
        """The block's location, or None: it reads as zeros."""
        return self._blocks.get(block)

    def chunks(self) -> set[str]:
        return {ref.chunk for ref in self._blocks.values()}


class LayerWriter:
    """Packs blocks into chunks, uploads each chunk once, and finally the layer's index."""

    def __init__(
        self,
        store: ObjectStore,
        layer_id: str,
        parent: str | None,
        size: int,
        block_size: int = BLOCK_SIZE,
    ) -> None:
        self._store = store
        self._index = LayerIndex(layer_id, parent, size, block_size=block_size)
        self._pending: list[tuple[int, bytes]] = []
        self._pending_bytes = 0

    def add_block(self, block: int, data: bytes) -> None:
        if len(data) != self._index.block_size:
            raise ValueError(f"block {block} has {len(data)} bytes, not {self._index.block_size}")
        self._pending.append((block, data))
        self._pending_bytes += len(data)
        if self._pending_bytes >= CHUNK_TARGET:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        payload = b"".join(data for _, data in self._pending)
        digest = hashlib.sha256(payload).hexdigest()
        if not self._store.exists(chunk_key(digest)):
            self._store.put(chunk_key(digest), payload)
        for i, (block, _) in enumerate(self._pending):
            self._index.blocks[block] = BlockRef(digest, i * self._index.block_size)
        self._pending, self._pending_bytes = [], 0

    def finish(self) -> LayerIndex:
        """Upload what is left and the index (last, so a visible index is complete)."""
        self._flush()
        self._store.put(layer_key(self._index.layer_id), self._index.to_json())
        return self._index
