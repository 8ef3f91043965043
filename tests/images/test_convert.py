"""OCI layers to block layers: real loop mounts, checked file by file on the stacked image."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentenv.images.convert import (
    ConversionError,
    convert_image,
    convert_layer,
    format_layer,
    load_layer,
    loop_mount,
    materialize,
)
from agentenv.storage.layer import BLOCK_SIZE, Stack, chain_id, layer_key
from agentenv.storage.posix import PosixObjectStore

from .test_tarapply import MTIME, E, diff_id, make_tar, wh

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("losetup") is None, reason="needs root and loop devices"
)

SIZE = 128 * 2**20
BIG = os.urandom(5 * 2**20)


def _leaks(path: Path) -> list[str]:
    """Loop devices backed by, and mounts under, `path`."""
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    found = [line for line in loops.splitlines() if str(path) in line]
    with open("/proc/mounts") as fh:
        found += [line for line in fh if str(path) in line]
    return found


@pytest.fixture(autouse=True)
def no_leaks(tmp_path: Path) -> Iterator[None]:
    assert _leaks(tmp_path) == []
    yield
    assert _leaks(tmp_path) == []


@pytest.fixture
def store(tmp_path: Path) -> PosixObjectStore:
    return PosixObjectStore(tmp_path / "store")


def _write(tmp_path: Path, name: str, entries: list[E]) -> tuple[Path, str]:
    tar = make_tar(entries)
    path = tmp_path / f"{name}.tar"
    path.write_bytes(tar)
    return path, diff_id(tar)


def _layers(tmp_path: Path) -> list[tuple[Path, str]]:
    base = [
        E("etc", "dir", mode=0o755),
        E("etc/hostname", data=b"base\n"),
        E("etc/gone", data=b"whited out\n"),
        E("opt/keep/a.txt", data=b"a"),
        E("opt/keep/b.txt", data=b"b"),
        E("usr/bin/tool", data=b"#!/bin/sh\necho tool\n", mode=0o755),
        E("var/lib/x", data=b"file, becomes a dir"),
    ]
    second = [
        wh("etc/gone"),
        E("opt/keep/new.txt", data=b"new"),
        E("opt/keep/.wh..wh..opq"),
        E("usr/bin/tool2", "link", target="usr/bin/tool"),
        E("etc/x", data=b"x"),
        E("etc/x-link", "link", target="etc/x"),
        E("etc/localtime", "sym", target="/usr/share/zoneinfo/UTC"),
        E("dev/null", "chr", mode=0o666, dev=(1, 3)),
        E("usr/bin/su", data=b"su", mode=0o4755),
        E("etc/attr", data=b"attr", xattrs={"user.test": "value"}),
        E("home/u/file", data=b"mine", mode=0o600, uid=1000, gid=1000),
        E("data/big.bin", data=BIG),
        E("var/lib/x", "dir", mode=0o700),
        E("var/lib/x/inner", data=b"inner"),
    ]
    third = [E("etc/hostname", data=b"modified\n", mode=0o600)]
    return [_write(tmp_path, f"l{i}", e) for i, e in enumerate((base, second, third))]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fsck(image: Path) -> None:
    proc = subprocess.run(["e2fsck", "-fn", image], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_format_layer_is_deterministic(tmp_path: Path) -> None:
    a, b = PosixObjectStore(tmp_path / "a"), PosixObjectStore(tmp_path / "b")
    la, lb = format_layer(a, SIZE), format_layer(b, SIZE)
    assert la.layer_id == lb.layer_id == chain_id(None, f"format:ext4:{SIZE}:aenv-rootfs")
    assert a.list("") == b.list("")  # same chunks, same digests
    materialize(Stack([la]), a, tmp_path / "a.img")
    materialize(Stack([lb]), b, tmp_path / "b.img")
    assert _sha(tmp_path / "a.img") == _sha(tmp_path / "b.img")
    # Sparse: only non-zero blocks are stored and written.
    assert len(la.blocks) * BLOCK_SIZE < SIZE // 20
    assert (tmp_path / "a.img").stat().st_blocks * 512 < SIZE // 20
    _fsck(tmp_path / "a.img")
    label = subprocess.run(
        ["blkid", "-o", "value", "-s", "LABEL", tmp_path / "a.img"], capture_output=True, text=True
    ).stdout.strip()
    assert label == "aenv-rootfs"
    assert format_layer(a, SIZE, "other").layer_id != la.layer_id
    with pytest.raises(ConversionError):
        format_layer(a, SIZE + 1)


def test_convert_image_and_check_every_file(tmp_path: Path, store: PosixObjectStore) -> None:
    tars = _layers(tmp_path)
    work = tmp_path / "work"
    messages: list[str] = []
    layers = convert_image(store, tars, SIZE, work, progress=messages.append)
    assert len(layers) == 4 and layers[0].parent is None
    assert [ly.parent for ly in layers[1:]] == [ly.layer_id for ly in layers[:-1]]
    assert layers[2].layer_id == chain_id(layers[1].layer_id, tars[1][1])
    assert os.listdir(work) == [] and messages
    # Changed blocks only: the last layer rewrote one small file.
    assert len(layers[3].blocks) < 40 and len(layers[2].blocks) >= len(BIG) // BLOCK_SIZE
    image = tmp_path / "top.img"
    materialize(Stack(layers), store, image)
    _fsck(image)
    with loop_mount(image, tmp_path / "mnt", readonly=True) as m:
        assert (m / "etc/hostname").read_bytes() == b"modified\n"
        assert stat.S_IMODE((m / "etc/hostname").stat().st_mode) == 0o600
        assert not (m / "etc/gone").exists()
        assert os.listdir(m / "opt/keep") == ["new.txt"]
        tool, tool2 = (m / "usr/bin/tool").lstat(), (m / "usr/bin/tool2").lstat()
        assert tool.st_ino == tool2.st_ino and tool.st_nlink == 2
        assert stat.S_IMODE(tool.st_mode) == 0o755
        assert (m / "etc/x").stat().st_ino == (m / "etc/x-link").stat().st_ino
        assert os.readlink(m / "etc/localtime") == "/usr/share/zoneinfo/UTC"
        null = (m / "dev/null").lstat()
        assert stat.S_ISCHR(null.st_mode) and null.st_rdev == os.makedev(1, 3)
        assert stat.S_IMODE(null.st_mode) == 0o666
        assert stat.S_IMODE((m / "usr/bin/su").stat().st_mode) == 0o4755
        assert os.getxattr(m / "etc/attr", "user.test") == b"value"
        home = (m / "home/u/file").stat()
        assert (home.st_uid, home.st_gid, stat.S_IMODE(home.st_mode)) == (1000, 1000, 0o600)
        assert _sha(m / "data/big.bin") == hashlib.sha256(BIG).hexdigest()
        assert (m / "data/big.bin").stat().st_mtime == MTIME
        assert stat.S_IMODE((m / "var/lib/x").stat().st_mode) == 0o700
        assert (m / "var/lib/x/inner").read_bytes() == b"inner"
        assert (m / "opt/keep/new.txt").read_bytes() == b"new"


def test_reconversion_and_sharing(tmp_path: Path, store: PosixObjectStore) -> None:
    tars = _layers(tmp_path)
    first = convert_image(store, tars[:2], SIZE, tmp_path / "w")
    keys = store.list("")
    again = convert_image(store, tars[:2], SIZE, tmp_path / "w")
    assert [ly.layer_id for ly in again] == [ly.layer_id for ly in first]
    assert store.list("") == keys
    # A stored layer is returned without touching the (here missing) parent image.
    top = convert_layer(store, tmp_path / "nope.img", first[1], tars[1][0], tars[1][1], tmp_path)
    assert top.layer_id == first[2].layer_id
    # Another image on the same base shares its layers and adds only its own.
    other = _write(tmp_path, "other", [E("srv/app", data=b"app")])
    second = convert_image(store, [*tars[:2], other], SIZE, tmp_path / "w")
    assert [ly.layer_id for ly in second[:3]] == [ly.layer_id for ly in first]
    added = set(store.list("layers/")) - set(keys)
    assert added == {layer_key(second[3].layer_id)}


def test_malicious_tar_writes_nothing_outside(tmp_path: Path, store: PosixObjectStore) -> None:
    tag = uuid.uuid4().hex
    evil = _write(tmp_path, "evil", [E("root", "sym", target="/"), E(f"root/etc/{tag}")])
    layers = convert_image(store, [evil], SIZE, tmp_path / "w")
    assert not Path(f"/etc/{tag}").exists()
    image = tmp_path / "img"
    materialize(Stack(layers), store, image)
    with loop_mount(image, tmp_path / "mnt", readonly=True) as m:
        assert (m / "etc" / tag).is_file()
    dotdot = _write(tmp_path, "dotdot", [E(f"../../{tag}", data=b"x")])
    with pytest.raises(ConversionError, match=rf"{dotdot[1]}: apply tar: .*\.\.") as err:
        convert_image(store, [dotdot], SIZE, tmp_path / "w")
    assert err.value.status == 500
    assert not (tmp_path / tag).exists() and not (tmp_path.parent / tag).exists()
    fmt = layers[0]
    assert load_layer(store, chain_id(fmt.layer_id, dotdot[1])) is None
    assert os.listdir(tmp_path / "w") == []


def test_wrong_diff_id(tmp_path: Path, store: PosixObjectStore) -> None:
    path, _ = _write(tmp_path, "l", [E("f", data=b"f")])
    bogus = "sha256:" + "0" * 64
    with pytest.raises(ConversionError, match="diff id"):
        convert_image(store, [(path, bogus)], SIZE, tmp_path / "w")
    assert store.list("layers/") == [layer_key(format_layer(store, SIZE).layer_id)]


def test_image_too_small(tmp_path: Path, store: PosixObjectStore) -> None:
    small = 16 * 2**20
    big = _write(tmp_path, "big", [E("big", data=os.urandom(24 * 2**20))])
    with pytest.raises(ConversionError, match=rf"{big[1]}: apply tar: the image .* is full"):
        convert_image(store, [big], small, tmp_path / "w")
    assert len(store.list("layers/")) == 1  # the format layer only
    assert os.listdir(tmp_path / "w") == []


@pytest.mark.parametrize(
    ("tmpfs", "payload", "step"),
    [("256k", 0, "copy parent image"), ("1m", 4 * 2**20, "sync")],
)
def test_workdir_full(
    tmp_path: Path, store: PosixObjectStore, tmpfs: str, payload: int, step: str
) -> None:
    """ENOSPC copying the parent, or writing through the loop device: a clear error."""
    layers = convert_image(store, [_write(tmp_path, "l0", [E("f", data=BIG)])], SIZE, tmp_path)
    parent = tmp_path / "parent.img"
    materialize(Stack(layers) if payload == 0 else Stack(layers[:1]), store, parent)
    tar = _write(tmp_path, "l1", [E("g", data=os.urandom(payload))])
    work = tmp_path / "tiny"
    work.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs}", "tmpfs", work], check=True)
    try:
        with pytest.raises(ConversionError, match=rf"(?s){tar[1]}: {step}: .*(no space|No space)"):
            convert_layer(store, parent, layers[-1 if payload == 0 else 0], *tar, work)
        assert os.listdir(work) == []
    finally:
        subprocess.run(["umount", work], check=True)
    assert len(store.list("layers/")) == 2  # the format layer and l0 only


def test_materialize_is_sparse(tmp_path: Path, store: PosixObjectStore) -> None:
    layers = convert_image(store, _layers(tmp_path)[:2], SIZE, tmp_path / "w")
    image = tmp_path / "img"
    materialize(Stack(layers), store, image)
    st = image.stat()
    assert st.st_size == SIZE and st.st_blocks * 512 < 16 * 2**20
