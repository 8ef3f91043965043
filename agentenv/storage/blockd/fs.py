"""The FUSE file system of the block daemon: a flat, read-only directory of `<name>.img`.

Each file is one layer stack seen as a raw file: a disk, or guest RAM (4 KiB blocks). A
read resolves its blocks through `Stack.lookup`, merges neighbouring bytes of one chunk
into a single chunk-source read and fills holes with zeros. Content never changes for an
inode, so the kernel page cache is kept across opens (`keep_cache`) and does most of the
serving.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from dataclasses import dataclass, field
from typing import Protocol

import pyfuse3
import trio

from ..layer import BLOCK_SIZE, Stack

log = logging.getLogger(__name__)

SUFFIX = ".img"
# No `max_read` mount option: libfuse refuses it unless init() sets the same value, which
# pyfuse3 does not. Without it a request may be as big as the kernel's max_pages (256
# pages = 1 MiB here), negotiated by libfuse; the daemon raises the mount's read-ahead so
# sequential reads actually come in requests that big (fewer Python round trips per byte).
# An inode's content and size never change and a removed name is invalidated explicitly,
# so the kernel may keep attributes and names for long.
_TIMEOUT = 3600.0
# Reads up to this size are served in the FUSE loop itself when their chunks are local.
INLINE_READ_MAX = 128 * 1024


class ChunkSource(Protocol):
    """Where chunk bytes come from: the chunk cache in the daemon, a stand-in in tests."""

    def read(self, digest: str, offset: int, length: int) -> bytes: ...

    def read_cached(self, digest: str, offset: int, length: int) -> bytes | None: ...


@dataclass(frozen=True)
class Segment:
    """`length` bytes at `offset` of chunk `chunk`, or zeros when `chunk` is None."""

    chunk: str | None
    offset: int
    length: int


def plan_read(stack: Stack, offset: int, length: int) -> list[Segment]:
    """The chunk reads that make up `length` bytes at `offset`, adjacent ranges merged."""
    end = min(offset + length, stack.size)
    segments: list[Segment] = []
    pos = offset
    while pos < end:
        block, within = divmod(pos, stack.block_size)
        n = min(stack.block_size - within, end - pos)
        ref = stack.lookup(block)
        seg = Segment(None, 0, n) if ref is None else Segment(ref.chunk, ref.offset + within, n)
        last = segments[-1] if segments else None
        if last is not None and last.chunk == seg.chunk:
            if seg.chunk is None or last.offset + last.length == seg.offset:
                segments[-1] = Segment(last.chunk, last.offset, last.length + n)
                pos += n
                continue
        segments.append(seg)
        pos += n
    return segments


def read_segments(
    source: ChunkSource, segments: list[Segment], cached_only: bool = False
) -> bytes | None:
    """Fetch each segment (zeros for holes) and join them; blocking, unless `cached_only`:
    then None as soon as one chunk is not local and verified."""
    parts: list[bytes] = []
    for seg in segments:
        if seg.chunk is None:
            parts.append(bytes(seg.length))
            continue
        if cached_only:
            data = source.read_cached(seg.chunk, seg.offset, seg.length)
            if data is None:
                return None
        else:
            data = source.read(seg.chunk, seg.offset, seg.length)
        if len(data) != seg.length:
            raise OSError(
                errno.EIO,
                f"chunk {seg.chunk} gave {len(data)} bytes at {seg.offset}, wanted {seg.length}",
            )
        parts.append(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


@dataclass
class Image:
    """One served file: a stack under a name, with an inode that is never reused."""

    name: str
    layers: list[str]
    stack: Stack
    inode: int
    ctime_ns: int = field(default_factory=time.time_ns)

    @property
    def size(self) -> int:
        return self.stack.size

    @property
    def filename(self) -> str:
        return self.name + SUFFIX


class BlockFS(pyfuse3.Operations):
    """Serves images; `add`/`remove` must run in the trio thread that runs `pyfuse3.main`."""

    def __init__(self, source: ChunkSource, workers: int = 16) -> None:
        super().__init__()
        self.source = source
        self._by_name: dict[str, Image] = {}
        self._by_inode: dict[int, Image] = {}
        # Open handles keep their image, so a removed name stays readable by whoever has it
        # open (QEMU), like an unlinked file.
        self._handles: dict[int, Image] = {}
        self._next_inode = pyfuse3.ROOT_INODE + 1
        self._next_fh = 1
        self._limiter = trio.CapacityLimiter(workers)
        self._mounted = False
        self._root_ns = time.time_ns()
        self.reads = 0
        self.read_bytes = 0
        self.read_errors = 0

    # -- management (called by the daemon) --------------------------------------------

    def images(self) -> list[Image]:
        return sorted(self._by_name.values(), key=lambda i: i.inode)

    def get(self, name: str) -> Image | None:
        return self._by_name.get(name)

    def add(self, name: str, layers: list[str], stack: Stack) -> Image:
        if name in self._by_name:
            raise ValueError(f"image {name!r} is already served")
        image = Image(name, list(layers), stack, self._next_inode)
        self._next_inode += 1
        self._by_name[name] = image
        self._by_inode[image.inode] = image
        return image

    def remove(self, name: str) -> Image | None:
        image = self._by_name.pop(name, None)
        if image is None:
            return None
        if not any(h is image for h in self._handles.values()):
            self._by_inode.pop(image.inode, None)
        if self._mounted:
            # The kernel caches names for _TIMEOUT; tell it this one is gone.
            pyfuse3.invalidate_entry_async(
                pyfuse3.ROOT_INODE, image.filename.encode(), image.inode, ignore_enoent=True
            )
        return image

    def init(self) -> None:
        self._mounted = True

    # -- attributes and names -----------------------------------------------------------

    def _attrs(self, image: Image | None) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.entry_timeout = _TIMEOUT
        attrs.attr_timeout = _TIMEOUT
        attrs.st_uid = os.getuid()
        attrs.st_gid = os.getgid()
        attrs.st_blksize = BLOCK_SIZE
        if image is None:
            attrs.st_ino = pyfuse3.ROOT_INODE
            attrs.st_mode = stat.S_IFDIR | 0o555
            attrs.st_nlink = 2
            ns = self._root_ns
        else:
            attrs.st_ino = image.inode
            attrs.st_mode = stat.S_IFREG | 0o444
            attrs.st_nlink = 1 if image.name in self._by_name else 0
            attrs.st_size = image.size
            attrs.st_blocks = (image.size + 511) // 512
            ns = image.ctime_ns
        attrs.st_atime_ns = attrs.st_mtime_ns = attrs.st_ctime_ns = ns
        return attrs

    def _image(self, inode: int) -> Image:
        image = self._by_inode.get(inode)
        if image is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return image

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode == pyfuse3.ROOT_INODE:
            return self._attrs(None)
        return self._attrs(self._image(inode))

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        if parent_inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if name in (b".", b".."):
            return self._attrs(None)
        text = os.fsdecode(name)
        image = self._by_name.get(text[: -len(SUFFIX)]) if text.endswith(SUFFIX) else None
        if image is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attrs(image)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if inode != pyfuse3.ROOT_INODE:
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        # Entries are ordered by inode, which also serves as the resume position.
        for image in self.images():
            if image.inode <= start_id:
                continue
            if not pyfuse3.readdir_reply(
                token, image.filename.encode(), self._attrs(image), image.inode
            ):
                break

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        data.f_bsize = data.f_frsize = BLOCK_SIZE
        data.f_blocks = sum(-(-i.size // BLOCK_SIZE) for i in self._by_name.values())
        data.f_files = len(self._by_name) + 1
        data.f_namemax = 255
        return data

    # -- data -----------------------------------------------------------------------------

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        image = self._image(inode)
        if flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC:
            raise pyfuse3.FUSEError(errno.EROFS)
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = image
        # keep_cache: the bytes of an inode never change, so pages survive close/open.
        return pyfuse3.FileInfo(fh=fh, keep_cache=True, direct_io=False)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        image = self._handles.get(fh)
        if image is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        if off >= image.size or size <= 0:
            return b""
        segments = plan_read(image.stack, off, size)
        # Small reads of local chunks inline: a thread hop costs more than their pread.
        # Anything that might fetch (or hash a chunk) goes to a worker thread.
        inline = size <= INLINE_READ_MAX or all(seg.chunk is None for seg in segments)
        try:
            data = read_segments(self.source, segments, cached_only=True) if inline else None
            if data is None:
                data = await trio.to_thread.run_sync(
                    read_segments, self.source, segments, limiter=self._limiter
                )
        except Exception:
            self.read_errors += 1
            log.exception("read of %s at %d+%d failed", image.filename, off, size)
            raise pyfuse3.FUSEError(errno.EIO) from None
        assert data is not None
        self.reads += 1
        self.read_bytes += len(data)
        return data

    async def release(self, fh: int) -> None:
        image = self._handles.pop(fh, None)
        if image is not None and image.name not in self._by_name:
            if not any(h is image for h in self._handles.values()):
                self._by_inode.pop(image.inode, None)

    async def flush(self, fh: int) -> None:
        return None

    async def fsync(self, fh: int, datasync: bool) -> None:
        return None

    # -- everything that would change the tree or the data is refused --------------------

    async def write(self, fh: int, off: int, buf: bytes) -> int:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def setattr(self, inode, attr, fields, fh, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def create(self, parent_inode, name, mode, flags, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mknod(self, parent_inode, name, mode, rdev, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mkdir(self, parent_inode, name, mode, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def unlink(self, parent_inode, name, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rmdir(self, parent_inode, name, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rename(self, p_old, n_old, p_new, n_new, flags, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def link(self, inode, new_parent_inode, new_name, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)

    async def symlink(self, parent_inode, name, target, ctx):  # type: ignore[no-untyped-def]
        raise pyfuse3.FUSEError(errno.EROFS)


def mount_options(fsname: str = "aenv-blockd") -> set[str]:
    """Options for `pyfuse3.init`; see the daemon's module docstring for why each is set."""
    return {
        f"fsname={fsname}",
        "subtype=aenv-blockd",
        "ro",
        "default_permissions",
        "allow_other",
    }
