"""A volume's files through the content API's operations, on a real directory: E2B's
semantics (as its SDK's own mock has them), and nothing reached outside the volume."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentenv.errors import Conflict, NotFound, TooLarge
from agentenv.volumes.content import VolumeFiles


async def _body(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def volume_files(tmp_path: Path) -> VolumeFiles:
    """A volume's directory and the spool, as the node makes them."""
    (tmp_path / "vol").mkdir()
    (tmp_path / "spool").mkdir()
    return VolumeFiles(tmp_path / "vol", tmp_path / "spool")


def write(files: VolumeFiles, path: str, data: bytes, force: bool = False, **kw) -> dict:
    return asyncio.run(
        files.write_file(
            path, _body(data), 1 << 20, kw.get("uid"), kw.get("gid"), kw.get("mode"), force
        )
    )


def test_files_and_directories(tmp_path: Path) -> None:
    files = volume_files(tmp_path)
    made = files.make_dir("/a/b", 1000, 1000, 0o700, force=True)
    assert (made["path"], made["type"], made["mode"], made["uid"]) == (
        "/a/b",
        "directory",
        0o700,
        1000,
    )
    with pytest.raises(Conflict):
        files.make_dir("a/b", None, None, None, force=False)
    with pytest.raises(NotFound):
        files.make_dir("/x/y", None, None, None, force=False)
    entry = write(files, "a/b/f.txt", b"hello", uid=1000, gid=1000)
    assert (entry["size"], entry["mode"], entry["type"]) == (5, 0o644, "file")
    with pytest.raises(Conflict, match="already exists"):
        write(files, "a/b/f.txt", b"again")
    assert write(files, "a/b/f.txt", b"replaced", force=True)["size"] == 8
    assert b"".join(files.read_file("/a/b/f.txt")) == b"replaced"
    with pytest.raises(Conflict, match="is a directory"):
        write(files, "/a", b"x", force=True)
    with pytest.raises(NotFound):
        write(files, "/nope/f.txt", b"x")
    listing = files.list_dir("/", depth=3)
    assert [e["path"] for e in listing] == ["/a", "/a/b", "/a/b/f.txt"]
    assert [e["path"] for e in files.list_dir("/a")] == ["/a/b"]
    updated = files.update("/a/b/f.txt", uid=2000, gid=None, mode=0o600)
    # The replaced file is a new one: root's, as nothing else was asked.
    assert (updated["uid"], updated["gid"], updated["mode"]) == (2000, 0, 0o600)
    files.remove("/a")
    assert files.list_dir("/") == []
    with pytest.raises(NotFound):
        files.remove("/")
    with pytest.raises(NotFound):
        files.stat("/a")
    with pytest.raises(TooLarge):
        asyncio.run(files.write_file("/big", _body(b"x" * 10), 5, None, None, None, False))
    # The cut-off upload left nothing behind.
    assert os.listdir(tmp_path / "vol") == [] and os.listdir(tmp_path / "spool") == []


def test_nothing_outside_the_volume_is_reached(tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("host file")
    files = volume_files(tmp_path)
    # `..` stops at the volume's root.
    write(files, "../../secret.txt", b"inside")
    assert outside.read_text() == "host file"
    assert (tmp_path / "vol" / "secret.txt").read_bytes() == b"inside"
    # A symlink (as a guest could make) is shown as one, and resolves inside the volume.
    os.symlink(str(tmp_path), tmp_path / "vol" / "escape")
    assert files.stat("/escape")["type"] == "symlink"
    with pytest.raises(NotFound):
        list(files.read_file("/escape/secret.txt"))


def test_what_a_guest_makes_in_a_mounted_volume_keeps_requests_inside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host file")
    files = volume_files(tmp_path)
    vol = tmp_path / "vol"
    # A directory swapped for a symlink out of the volume: resolved inside it instead.
    os.symlink(str(outside), vol / "dir")
    with pytest.raises(NotFound):
        list(files.read_file("/dir/secret.txt"))
    with pytest.raises(NotFound):
        write(files, "/dir/secret.txt", b"overwritten")
    with pytest.raises(NotFound):
        files.update("/dir/secret.txt", uid=1234, gid=None, mode=0o777)
    assert (outside / "secret.txt").read_text() == "host file"
    assert oct((outside / "secret.txt").stat().st_mode & 0o777) != oct(0o777)
    # A FIFO (opening one blocks) and a device node (opening one acts on the node) are
    # listed but never opened.
    os.mkfifo(vol / "fifo")
    os.mknod(vol / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    assert {e["name"]: e["type"] for e in files.list_dir("/")}["fifo"] == "unknown"
    for path in ("/fifo", "/null"):
        with pytest.raises(NotFound):
            list(files.read_file(path))
    # Removing a symlinked directory removes the link, never what it points at.
    files.remove("/dir")
    assert (outside / "secret.txt").exists()
