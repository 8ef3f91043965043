"""Blobs on disk: verified-while-read atomic writes, and uncompressed views of layer files."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import secrets
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from .manifest import Descriptor, layer_compression
from .registry_errors import DigestMismatch

__all__ = [
    "Progress",
    "Verifier",
    "iter_layer_bytes",
    "layer_diff_id",
    "open_layer_stream",
    "write_verified",
]

# Large enough to keep syscalls rare, small enough to keep memory flat.
CHUNK_SIZE = 1 << 20

Progress = Callable[[int, int], None]
"""Called as progress(bytes_done, bytes_total) while a blob downloads."""


class Verifier:
    """Checks size and digest of bytes as they stream past; fails as soon as size overruns."""

    def __init__(self, digest: str, size: int, what: str = "blob") -> None:
        algorithm, _, self._hex = digest.partition(":")
        self._hash = hashlib.new(algorithm)
        self._algorithm = algorithm
        self.digest = digest
        self.size = size
        self.what = what
        self.count = 0

    def update(self, chunk: bytes) -> None:
        self.count += len(chunk)
        if self.count > self.size:
            raise DigestMismatch(f"{self.what} {self.digest}", f"{self.size} bytes", "more")
        self._hash.update(chunk)

    def finish(self) -> None:
        if self.count != self.size:
            raise DigestMismatch(
                f"{self.what} {self.digest}", f"{self.size} bytes", f"{self.count} bytes"
            )
        actual = f"{self._algorithm}:{self._hash.hexdigest()}"
        if actual != self.digest:
            raise DigestMismatch(self.what, self.digest, actual)


def write_verified(
    chunks: Iterable[bytes], descriptor: Descriptor, dest: Path, progress: Progress | None = None
) -> Path:
    """Stream `chunks` into `dest` via a temp file; rename only if size and digest match."""
    verifier = Verifier(descriptor.digest, descriptor.size)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Same directory so the rename is atomic; a random suffix so concurrent pulls do not collide.
    tmp = dest.parent / f".{dest.name}.{secrets.token_hex(6)}.part"
    try:
        with open(tmp, "xb") as out:
            for chunk in chunks:
                verifier.update(chunk)
                out.write(chunk)
                if progress is not None:
                    progress(verifier.count, descriptor.size)
            verifier.finish()
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return dest


@contextlib.contextmanager
def open_layer_stream(path: Path, media_type: str) -> Iterator[BinaryIO]:
    """A readable stream of the layer's uncompressed tar bytes (gzip, zstd or plain)."""
    compression = layer_compression(media_type)
    with open(path, "rb") as raw:
        if compression == "gzip":
            # GzipFile (zlib underneath) also handles multi-member gzip, which pigz writes.
            with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                yield stream  # type: ignore[misc]
        elif compression == "zstd":
            import zstandard

            reader = zstandard.ZstdDecompressor().stream_reader(
                raw, read_across_frames=True, closefd=False
            )
            with reader:
                yield reader
        else:
            yield raw


def iter_layer_bytes(path: Path, media_type: str, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Iterate the layer's uncompressed tar bytes in chunks."""
    with open_layer_stream(path, media_type) as stream:
        while chunk := stream.read(chunk_size):
            yield chunk


def layer_diff_id(path: Path, media_type: str) -> str:
    """sha256 of the uncompressed tar: what the config's `rootfs.diff_ids` lists."""
    digest = hashlib.sha256()
    for chunk in iter_layer_bytes(path, media_type):
        digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"
