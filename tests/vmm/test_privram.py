"""`privram`: the library QEMU is preloaded with, on real processes. It opens the named
file read-only whatever was asked, turns hole punches on it into no-ops so the discard
that follows drops only private pages, and leaves every other file alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentenv.vmm import privram
from agentenv.vmm.qemucommand import build_command

from .test_qemu_command import _spec

# Opens RAM and OTHER read-write, maps RAM privately and writes to it, punches a hole in
# both (as QEMU's discard does before MADV_DONTNEED), and reports what it saw.
CHILD = r"""
import ctypes, json, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
PUNCH = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
ram, other = sys.argv[1], sys.argv[2]
ram_fd, other_fd = os.open(ram, os.O_RDWR), os.open(other, os.O_RDWR)
view = mmap.mmap(ram_fd, 8192, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
view[0:5] = b"guest"
print(json.dumps({
    "pid": os.getpid(),
    "ram_punch": libc.fallocate(ram_fd, PUNCH, 0, 4096),
    "other_punch": libc.fallocate(other_fd, PUNCH, 0, 4096),
    "mapped": view[0:5].decode(),
}), flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = privram.build(tmp_path_factory.mktemp("lib"))
    if built is None:
        pytest.fail("privram.c did not build (is a C compiler installed?)")
    return built


def test_the_ram_file_is_held_read_only_and_never_punched(library: Path, tmp_path: Path) -> None:
    ram, other = tmp_path / "memory.base", tmp_path / "disk"
    ram.write_bytes(b"R" * 8192)
    other.write_bytes(b"O" * 8192)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(ram), str(other)],
        env=privram.environment(library, ram),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        seen = json.loads(child.stdout.readline())
        assert seen["ram_punch"] == 0 and seen["mapped"] == "guest"
        assert privram.held_read_only(seen["pid"], ram)
        assert not privram.held_read_only(seen["pid"], other)
    finally:
        child.kill()
        child.wait()
    # The RAM file kept every byte (neither the private write nor the punch reached it);
    # the other file's hole was really punched.
    assert ram.read_bytes() == b"R" * 8192
    assert other.read_bytes() == b"\0" * 4096 + b"O" * 4096


def test_without_the_library_the_file_is_writable(tmp_path: Path) -> None:
    """The server's check has something to catch: a plain process holds it writable."""
    ram = tmp_path / "memory.base"
    ram.write_bytes(b"R" * 4096)
    with open(ram, "r+b"):
        assert not privram.held_read_only(os.getpid(), ram)
    assert not privram.held_read_only(os.getpid(), ram)  # not held at all


def test_a_library_build_is_reused(library: Path) -> None:
    assert privram.build(library.parent) == library


def test_a_clone_with_the_library_maps_the_snapshots_ram_writable_and_private(
    tmp_path: Path,
) -> None:
    base = tmp_path / "memory.base"
    cmd = build_command(
        "qemu-system-x86_64", "tcg", _spec(tmp_path), incoming=True, ram_base=base,
        base_discards=True,
    )  # fmt: skip
    backend = cmd[cmd.index("-object") + 1]
    assert backend.endswith(f"mem-path={base},share=off,merge=off")
