"""Convert OCI layer tars into block layers: each layer's ext4 change over its parent's image.

The bottom layer is a deterministic empty ext4 (`format_layer`); each OCI layer is applied
to a loop-mounted copy of its parent's image and stored as the blocks that changed
(`convert_layer`). Layer ids are chain ids, so a layer over a given parent is converted and
stored once. A failed conversion stores no index; chunks it already uploaded are harmless
(content-addressed, shared, and unreferenced ones are garbage for a later sweep).
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from agentenv.errors import AenvError
from agentenv.guest.buildutil import run
from agentenv.storage.filelayer import materialize
from agentenv.storage.layer import (
    BLOCK_SIZE,
    LayerIndex,
    LayerWriter,
    Stack,
    chain_id,
    layer_key,
)
from agentenv.storage.objectstore import ObjectNotFound, ObjectStore

from .tarapply import TarApplyError, apply_tar

__all__ = [
    "ConversionError",
    "convert_image",
    "convert_layer",
    "format_layer",
    "load_layer",
    "loop_mount",
    "materialize",
]

Progress = Callable[[str], None]

# Fixed identities make mkfs reproducible: same size and label, same bytes, same layer id.
FS_UUID = "5f1d0c2a-7e4b-4f3a-9c61-0a3e5b7d2c10"
HASH_SEED = "0b9e4c6d-2a71-4e58-8f03-6d1c2b9a4e77"
FAKE_TIME = "1704067200"  # 2024-01-01: mkfs stamps this instead of now
# Pinned mke2fs settings, so the host's /etc/mke2fs.conf cannot change the base layer.
MKE2FS_CONF = """[defaults]
\tbase_features = sparse_super,large_file,filetype,resize_inode,dir_index,ext_attr
\tdefault_mntopts = acl,user_xattr
\tenable_periodic_fsck = 0
\tblocksize = 4096
\tinode_size = 256
\tinode_ratio = 16384
[fs_types]
\text4 = {
\t\tfeatures = has_journal,extent,huge_file,flex_bg,metadata_csum,64bit,dir_nlink,extra_isize
\t}
"""
_WINDOW = 64 * BLOCK_SIZE  # diff read size: 4 MiB from each image at a time


class ConversionError(AenvError):
    """A layer could not be converted; the message names the layer and the failing step."""

    # Converting the same layer fails the same way again.
    permanent = True


def _run(what: str, argv: Sequence[str | os.PathLike[str]], **kw: object) -> str:
    return run(what, argv, error=ConversionError, **kw)


def _space_hint(workdir: Path) -> str:
    # The loop device turns a full workdir into I/O errors inside the image; name the cause.
    try:
        st = os.statvfs(workdir)
    except OSError:
        return ""
    if st.f_bavail * st.f_frsize < 16 * BLOCK_SIZE:
        return f" (no space left in workdir {workdir})"
    return ""


def load_layer(store: ObjectStore, layer_id: str) -> LayerIndex | None:
    """The stored index of `layer_id`, or None if it was never (completely) stored."""
    try:
        return LayerIndex.from_json(store.get(layer_key(layer_id)))
    except ObjectNotFound:
        return None


def _data_blocks(fd: int, size: int) -> list[tuple[int, int]]:
    """Block ranges [first, end) that hold data (not holes) in the file, via SEEK_DATA."""
    out: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                break
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        out.append((start // BLOCK_SIZE, -(-end // BLOCK_SIZE)))
        pos = end
    return out


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for first, end in sorted(ranges):
        if out and first <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((first, end))
    return out


def _pread(fd: int, length: int, offset: int) -> bytes:
    data = os.pread(fd, length, offset)
    return data + bytes(length - len(data)) if len(data) < length else data


def _is_zero(block: bytes | memoryview) -> bool:
    return bytes(block).count(0) == len(block)


def format_layer(
    store: ObjectStore, size_bytes: int, label: str = "aenv-rootfs", *, workdir: Path | None = None
) -> LayerIndex:
    """The bottom layer: an empty ext4 of `size_bytes`, byte-identical on every run."""
    if size_bytes <= 0 or size_bytes % BLOCK_SIZE:
        raise ConversionError(f"format: size {size_bytes} is not a multiple of {BLOCK_SIZE}")
    layer_id = chain_id(None, f"format:ext4:{size_bytes}:{label}")
    found = load_layer(store, layer_id)
    if found is not None:
        return found
    with tempfile.TemporaryDirectory(prefix="aenv-format-", dir=workdir) as tmp:
        image, conf = Path(tmp) / "format.img", Path(tmp) / "mke2fs.conf"
        conf.write_text(MKE2FS_CONF)
        with open(image, "wb") as fh:
            fh.truncate(size_bytes)
        env = {**os.environ, "E2FSPROGS_FAKE_TIME": FAKE_TIME, "MKE2FS_CONFIG": str(conf)}
        # Inode tables are zeroed now (as holes, by discard) so the guest's ext4lazyinit
        # does not write them into every sandbox's overlay; the journal needs no zeroing.
        opts = f"hash_seed={HASH_SEED},lazy_itable_init=0,lazy_journal_init=1,root_owner=0:0"
        argv = ["mkfs.ext4", "-q", "-F", "-L", label, "-U", FS_UUID, "-m", "0", "-E", opts]
        _run(f"format: mkfs.ext4 {size_bytes} bytes", [*argv, image], env=env)
        writer = LayerWriter(store, layer_id, None, size_bytes)
        fd = os.open(image, os.O_RDONLY)
        try:
            for first, end in _data_blocks(fd, size_bytes):
                for block in range(first, end):
                    data = _pread(fd, BLOCK_SIZE, block * BLOCK_SIZE)
                    if not _is_zero(data):
                        writer.add_block(block, data)
        finally:
            os.close(fd)
        return writer.finish()


@contextlib.contextmanager
def loop_mount(image: Path, mountpoint: Path, *, readonly: bool = False) -> Iterator[Path]:
    """Attach `image` to a loop device and mount it; unmount and detach whatever happens."""
    ro = ["--read-only"] if readonly else []
    dev = _run(f"losetup {image.name}", ["losetup", "--find", "--show", *ro, image]).strip()
    try:
        mountpoint.mkdir(parents=True, exist_ok=True)
        opts = "ro,noload" if readonly else "rw"
        _run(f"mount {image.name}", ["mount", "-t", "ext4", "-o", opts, dev, mountpoint])
        try:
            yield mountpoint
        finally:
            _umount(mountpoint)
    finally:
        _run(f"losetup -d {dev}", ["losetup", "-d", dev])
        with contextlib.suppress(OSError):
            mountpoint.rmdir()


def _umount(mountpoint: Path) -> None:
    # A just-finished writer can keep the mount busy for a moment; retry, never lazily.
    for attempt in range(20):
        try:
            _run(f"umount {mountpoint}", ["umount", mountpoint])
            return
        except ConversionError:
            if attempt == 19:
                raise
            time.sleep(0.1)


def _diff(
    store: ObjectStore, layer_id: str, parent: LayerIndex, old: Path, new: Path
) -> tuple[LayerIndex, int]:
    """Store the blocks of `new` that differ from `old` as layer `layer_id`."""
    size = parent.size
    writer = LayerWriter(store, layer_id, parent.layer_id, size)
    changed = 0
    ofd, nfd = os.open(old, os.O_RDONLY), os.open(new, os.O_RDONLY)
    try:
        # Blocks that are holes in both images are equal (zero); read only the rest.
        for first, end in _merge(_data_blocks(ofd, size) + _data_blocks(nfd, size)):
            for win in range(first, end, _WINDOW // BLOCK_SIZE):
                count = min(_WINDOW // BLOCK_SIZE, end - win)
                a = _pread(ofd, count * BLOCK_SIZE, win * BLOCK_SIZE)
                b = _pread(nfd, count * BLOCK_SIZE, win * BLOCK_SIZE)
                if a == b:
                    continue
                for i in range(count):
                    lo, hi = i * BLOCK_SIZE, (i + 1) * BLOCK_SIZE
                    if a[lo:hi] != b[lo:hi]:
                        writer.add_block(win + i, b[lo:hi])
                        changed += 1
    finally:
        os.close(ofd)
        os.close(nfd)
    return writer.finish(), changed


def convert_layer(
    store: ObjectStore,
    parent_stack_file: Path,
    parent: LayerIndex,
    layer_tar: BinaryIO | Path,
    diff_id: str,
    workdir: Path,
    *,
    result_image: Path | None = None,
    progress: Progress | None = None,
) -> LayerIndex:
    """Apply one OCI layer over `parent` (whose full image is `parent_stack_file`) and store it.

    An already stored layer is returned without work. `result_image`, if given, receives
    the new full image (so the next layer need not re-materialize).
    """
    layer_id = chain_id(parent.layer_id, diff_id)
    found = load_layer(store, layer_id)
    if found is not None:
        return found
    say = progress or (lambda _: None)
    what = f"layer {diff_id}"
    t0 = time.monotonic()
    scratch: Path | None = None
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        # A private directory: concurrent conversions may share `workdir`.
        scratch = Path(tempfile.mkdtemp(prefix=f"layer-{layer_id[:12]}-", dir=workdir))
        new, mnt = scratch / "image", scratch / "mnt"
        if parent_stack_file.stat().st_size != parent.size:
            raise ConversionError(f"{what}: {parent_stack_file} is not the parent's image")
        _run(f"{what}: copy parent image", ["cp", "--sparse=always", parent_stack_file, new])
        with loop_mount(new, mnt):
            try:
                if isinstance(layer_tar, Path):
                    with open(layer_tar, "rb") as fh:
                        result = apply_tar(fh, mnt)
                else:
                    result = apply_tar(layer_tar, mnt)
            except TarApplyError as exc:
                raise ConversionError(f"{what}: apply tar: {exc}") from exc
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise ConversionError(
                        f"{what}: apply tar: the image ({parent.size} bytes) is full: {exc}"
                    ) from exc
                raise ConversionError(f"{what}: apply tar: {exc}{_space_hint(workdir)}") from exc
            try:
                _run(f"{what}: sync", ["sync", "-f", mnt])  # syncfs of this mount only
            except ConversionError as exc:
                raise ConversionError(f"{exc}{_space_hint(workdir)}") from exc
        if diff_id.startswith("sha256:") and result.diff_id != diff_id:
            raise ConversionError(f"{what}: the layer's content has diff id {result.diff_id}")
        t1 = time.monotonic()
        try:
            index, changed = _diff(store, layer_id, parent, parent_stack_file, new)
        except Exception as exc:  # ObjectStoreError included: the index was not written
            raise ConversionError(f"{what}: diff and store blocks: {exc}") from exc
        t2 = time.monotonic()
        say(
            f"{what}: {result.entries} entries, {result.bytes / 2**20:.1f} MiB copied+applied in "
            f"{t1 - t0:.2f}s; {changed} blocks ({changed * BLOCK_SIZE / 2**20:.1f} MiB) "
            f"stored in {t2 - t1:.2f}s"
        )
        if result_image is not None:
            os.replace(new, result_image)
        return index
    except ConversionError:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise ConversionError(f"{what}: no space left in {workdir}: {exc}") from exc
        raise ConversionError(f"{what}: {type(exc).__name__}: {exc}") from exc
    finally:
        if scratch is not None:
            _remove_scratch(scratch)


def _remove_scratch(scratch: Path) -> None:
    # Named removals, not rmtree: rmtree would descend into a mount that failed to unmount.
    (scratch / "image").unlink(missing_ok=True)
    for d in (scratch / "mnt", scratch):
        with contextlib.suppress(OSError):
            d.rmdir()


def convert_image(
    store: ObjectStore,
    layer_tars: list[tuple[Path, str]],
    size_bytes: int,
    workdir: Path,
    progress: Progress | None = None,
) -> list[LayerIndex]:
    """Format layer plus one block layer per (tar, diff_id), bottom to top; reuses stored ones."""
    say = progress or (lambda _: None)
    workdir.mkdir(parents=True, exist_ok=True)
    layers = [format_layer(store, size_bytes, workdir=workdir)]
    scratch = Path(tempfile.mkdtemp(prefix="image-", dir=workdir))
    top, nxt = scratch / "top.img", scratch / "next.img"
    holds: str | None = None  # which layer's full image `top` holds
    try:
        for n, (tar, diff_id) in enumerate(layer_tars, 1):
            found = load_layer(store, chain_id(layers[-1].layer_id, diff_id))
            if found is not None:
                say(f"layer {n}/{len(layer_tars)} {diff_id}: already converted")
                layers.append(found)
                continue
            if holds != layers[-1].layer_id:
                try:
                    materialize(Stack(layers), store, top)
                except Exception as exc:
                    raise ConversionError(
                        f"layer {diff_id}: materialize parent: {exc}{_space_hint(scratch)}"
                    ) from exc
            say(f"layer {n}/{len(layer_tars)} {diff_id}: converting")
            index = convert_layer(
                store, top, layers[-1], tar, diff_id, workdir, result_image=nxt, progress=say
            )
            os.replace(nxt, top)
            holds = index.layer_id
            layers.append(index)
        return layers
    finally:
        top.unlink(missing_ok=True)
        nxt.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            scratch.rmdir()
