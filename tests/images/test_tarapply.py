"""Applying OCI layer tars to a directory: file types, metadata, whiteouts, confinement."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentenv.images.tarapply import TarApplyError, apply_tar

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown, mknod)")

MTIME = 1_700_000_000


@dataclass
class E:
    """One tar entry to build: kind is file, dir, sym, link, chr, blk or fifo."""

    name: str
    kind: str = "file"
    data: bytes = b""
    mode: int = 0o644
    uid: int = 0
    gid: int = 0
    target: str = ""
    dev: tuple[int, int] = (0, 0)
    xattrs: dict[str, str] = field(default_factory=dict)
    mtime: int = MTIME


_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "sym": tarfile.SYMTYPE,
    "link": tarfile.LNKTYPE,
    "chr": tarfile.CHRTYPE,
    "blk": tarfile.BLKTYPE,
    "fifo": tarfile.FIFOTYPE,
}


def make_tar(entries: list[E]) -> bytes:
    """A PAX tar of `entries`, in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for e in entries:
            ti = tarfile.TarInfo(e.name)
            ti.type = _TYPES[e.kind]
            ti.mode, ti.uid, ti.gid, ti.mtime = e.mode, e.uid, e.gid, e.mtime
            ti.linkname = e.target
            ti.devmajor, ti.devminor = e.dev
            ti.pax_headers = {f"SCHILY.xattr.{k}": v for k, v in e.xattrs.items()}
            if e.kind == "file":
                ti.size = len(e.data)
                tf.addfile(ti, io.BytesIO(e.data))
            else:
                tf.addfile(ti)
    return buf.getvalue()


def diff_id(tar: bytes) -> str:
    return "sha256:" + hashlib.sha256(tar).hexdigest()


def wh(path: str) -> E:
    """A whiteout entry hiding `path`."""
    head, _, base = path.rpartition("/")
    return E(f"{head}/.wh.{base}" if head else f".wh.{base}")


class NoSeek(io.RawIOBase):
    """A forward-only stream, like a registry download."""

    def __init__(self, data: bytes) -> None:
        self._src = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        return self._src.read(min(size, 7000) if size > 0 else size)


def apply(root: Path, entries: list[E]) -> None:
    apply_tar(NoSeek(make_tar(entries)), root)  # type: ignore[arg-type]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    return r


def test_types_and_metadata(root: Path) -> None:
    big = os.urandom(300_000)
    apply(
        root,
        [
            E("usr", "dir", mode=0o755),
            E("usr/bin/su", data=b"su", mode=0o4755),
            E("usr/bin/sg", data=b"sg", mode=0o2711, gid=5),
            E("tmp", "dir", mode=0o1777),
            E("home/u/f", data=big, mode=0o640, uid=1000, gid=1001),
            E("home/u/link", "sym", target="f", uid=1000, gid=1001),
            E("home/u/hard", "link", target="home/u/f"),
            E("dev/null", "chr", mode=0o666, dev=(1, 3)),
            E("dev/loopx", "blk", mode=0o660, dev=(7, 200), gid=6),
            E("run/fifo", "fifo", mode=0o620),
            E("etc/attr", data=b"x", xattrs={"user.test": "hello", "user.bin": "\xff\x00"}),
        ],
    )
    su = (root / "usr/bin/su").lstat()
    assert stat.S_IMODE(su.st_mode) == 0o4755 and su.st_mtime == MTIME
    sg = (root / "usr/bin/sg").lstat()
    assert stat.S_IMODE(sg.st_mode) == 0o2711 and sg.st_gid == 5
    assert stat.S_IMODE((root / "tmp").lstat().st_mode) == 0o1777
    f = (root / "home/u/f").lstat()
    assert (f.st_uid, f.st_gid, stat.S_IMODE(f.st_mode)) == (1000, 1001, 0o640)
    assert (root / "home/u/f").read_bytes() == big
    link = (root / "home/u/link").lstat()
    assert os.readlink(root / "home/u/link") == "f" and link.st_uid == 1000
    assert (root / "home/u/hard").lstat().st_ino == f.st_ino and f.st_nlink == 2
    null = (root / "dev/null").lstat()
    assert stat.S_ISCHR(null.st_mode) and os.major(null.st_rdev) == 1
    assert os.minor(null.st_rdev) == 3 and stat.S_IMODE(null.st_mode) == 0o666
    blk = (root / "dev/loopx").lstat()
    assert stat.S_ISBLK(blk.st_mode) and blk.st_rdev == os.makedev(7, 200) and blk.st_gid == 6
    assert stat.S_ISFIFO((root / "run/fifo").lstat().st_mode)
    assert os.getxattr(root / "etc/attr", "user.test") == b"hello"
    # Binary values survive tarfile's surrogateescape decoding.
    assert os.getxattr(root / "etc/attr", "user.bin") == "\xff\x00".encode()
    # Implied parent directories are created 0755 root-owned.
    assert stat.S_IMODE((root / "home").lstat().st_mode) == 0o755
    # Directory mtimes are set after their children were written.
    assert (root / "usr").lstat().st_mtime == MTIME


def test_whiteouts_and_opaque(root: Path) -> None:
    apply(
        root,
        [
            E("etc/gone", data=b"1"),
            E("etc/keep", data=b"2"),
            E("opt/d/a", data=b"a"),
            E("opt/d/sub/b", data=b"b"),
            E("opt/d/sub2/c", data=b"c"),
            E("opt/other", data=b"o"),
        ],
    )
    apply(
        root,
        [
            wh("etc/gone"),
            wh("etc/never-existed"),
            # This layer's own entries before the opaque marker must survive it.
            E("opt/d/new", data=b"n"),
            E("opt/d/sub2", "dir", mode=0o755),
            E("opt/d/sub2/mine", data=b"m"),
            E("opt/d/.wh..wh..opq"),
            # A whiteout of something this layer wrote does not hide it.
            E("opt/fresh", data=b"f"),
            wh("opt/fresh"),
            E("opt/.wh..wh.plnk", "dir"),
            # The usual order: directory, marker, then the directory's new content.
            E("opt/d/sub", "dir", mode=0o755),
            E("opt/d/sub/.wh..wh..opq"),
            E("opt/d/sub/z", data=b"z"),
        ],
    )
    assert not (root / "etc/gone").exists() and (root / "etc/keep").read_bytes() == b"2"
    assert sorted(os.listdir(root / "opt/d")) == ["new", "sub", "sub2"]
    assert os.listdir(root / "opt/d/sub") == ["z"]
    assert os.listdir(root / "opt/d/sub2") == ["mine"]
    assert (root / "opt/other").exists() and (root / "opt/fresh").exists()
    assert not (root / "opt/.wh..wh.plnk").exists()


def test_replace_types(root: Path) -> None:
    apply(
        root,
        [
            E("a", data=b"file"),
            E("b/child", data=b"c"),
            E("c", "sym", target="/etc"),
            E("d", "dir"),
        ],
    )
    apply(
        root,
        [
            E("a", "dir", mode=0o750),
            E("a/in", data=b"in"),
            E("b", data=b"now a file"),
            E("c", "dir", mode=0o755),
            E("d", "dir", mode=0o700, uid=7),  # stays a dir, metadata updated
        ],
    )
    assert (root / "a/in").read_bytes() == b"in"
    assert stat.S_IMODE((root / "a").lstat().st_mode) == 0o750
    assert (root / "b").read_bytes() == b"now a file"
    assert stat.S_ISDIR((root / "c").lstat().st_mode)
    assert (root / "d").lstat().st_uid == 7


def test_paths_through_symlinks_stay_in_root(root: Path, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"safe")
    apply(
        root,
        [
            E("evil", "sym", target="/"),
            E(f"evil/etc/{tag}", data=b"x"),
            E("up", "sym", target="../../../../.."),
            E("up/tmp2/y", data=b"y"),
            E("abs", "sym", target=str(outside)),
            E("abs/victim", data=b"pwned"),
            E("leaf", "sym", target=str(outside / "victim")),
        ],
    )
    assert not Path(f"/etc/{tag}").exists()
    assert (root / f"etc/{tag}").read_bytes() == b"x"
    assert (root / "tmp2/y").read_bytes() == b"y"
    assert (root / str(outside).lstrip("/") / "victim").read_bytes() == b"pwned"
    # Writing a file over a symlink replaces the symlink, never writes its target.
    apply(root, [E("leaf", data=b"pwned")])
    assert (outside / "victim").read_bytes() == b"safe"
    assert not (root / "leaf").is_symlink()


@pytest.mark.parametrize(
    "entry",
    [
        E("../../escape", data=b"x"),
        E("a/../../escape", data=b"x"),
        E("hl", "link", target="../escape-src"),
    ],
)
def test_dotdot_refused(root: Path, tmp_path: Path, entry: E) -> None:
    (tmp_path / "escape-src").write_bytes(b"host")
    with pytest.raises(TarApplyError, match=r"\.\."):
        apply(root, [entry])
    assert not (tmp_path / "escape").exists() and not (tmp_path.parent / "escape").exists()


def test_hardlink_through_symlink_cannot_reach_host(root: Path) -> None:
    with pytest.raises(TarApplyError, match="missing"):
        apply(root, [E("evil", "sym", target="/"), E("hl", "link", target="evil/etc/passwd")])
    assert not (root / "hl").exists()


def test_hardlink_to_lower_layer(root: Path) -> None:
    apply(root, [E("bin/tool", data=b"t", mode=0o755)])
    apply(root, [E("bin/tool2", "link", target="bin/tool")])
    assert (root / "bin/tool2").stat().st_ino == (root / "bin/tool").stat().st_ino


def test_compressed_and_diff_id(root: Path) -> None:
    import zstandard

    tar = make_tar([E("f", data=b"hello" * 1000)])
    for blob in (tar, gzip.compress(tar), zstandard.ZstdCompressor().compress(tar)):
        result = apply_tar(NoSeek(blob), root)  # type: ignore[arg-type]
        assert result.diff_id == diff_id(tar) and result.entries == 1
        assert (root / "f").read_bytes() == b"hello" * 1000


def test_zero_runs_become_holes(root: Path) -> None:
    data = b"head" + bytes(8 * 2**20) + b"tail"
    apply(root, [E("sparse", data=data)])
    st = (root / "sparse").stat()
    assert st.st_size == len(data) and st.st_blocks * 512 < 2**20
    assert hashlib.sha256((root / "sparse").read_bytes()).digest() == hashlib.sha256(data).digest()


def test_bad_stream(root: Path) -> None:
    tar = make_tar([E("f", data=os.urandom(10_000))])
    with pytest.raises((TarApplyError, OSError)):
        apply_tar(io.BytesIO(tar[:3000]), root)
