"""Written pages of a private file mapping, saved from one real process and written into
another, on this kernel's pagemap (no VM needed)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentenv.vmm import guestram
from agentenv.vmm.guestram import PAGE, load_delta, materialize, read_index, save_delta

PAGES = 64
# Maps a file privately, reads it all, writes the pages named on the command line, then
# answers each "dump" line with the mapping's digest.
_MAPPER = """
import hashlib, mmap, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
sum(m[i] for i in range(0, len(m), 4096))
for page in map(int, sys.argv[2:]):
    m[page * 4096 : page * 4096 + 5] = b"dirty"
print("ready", flush=True)
for line in sys.stdin:
    print(hashlib.sha256(m[:]).hexdigest(), flush=True)
"""


def _base(tmp_path: Path) -> Path:
    base = tmp_path / "memory.base"
    base.write_bytes(b"".join(bytes([i]) * PAGE for i in range(PAGES)))
    return base


class _Mapper:
    def __init__(self, base: Path, written: list[int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _MAPPER, str(base), *map(str, written)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def digest(self) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("dump\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()


@pytest.fixture
def mappers() -> Iterator[list[_Mapper]]:
    started: list[_Mapper] = []
    yield started
    for mapper in started:
        mapper.proc.kill()
        mapper.proc.wait()


def _digest_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.skipif(os.geteuid() != 0, reason="reads another process's pagemap and memory")
def test_written_pages_travel_to_another_mapping_and_the_base_is_untouched(
    tmp_path: Path, mappers: list[_Mapper]
) -> None:
    base = _base(tmp_path)
    before = _digest_of(base)
    written = [0, 1, 2, 17, 40, 63]
    source = _Mapper(base, written)
    mappers.append(source)
    delta = tmp_path / "memory.delta"
    assert save_delta(source.proc.pid, base, delta) == len(written)
    assert read_index(delta) == written

    # Into a fresh mapping of the same base: the same memory as the source's.
    target = _Mapper(base, [])
    mappers.append(target)
    assert target.digest() != source.digest()
    load_delta(target.proc.pid, base, delta)
    assert target.digest() == source.digest()

    # Into one whole file: the same bytes again.
    whole = tmp_path / "memory"
    materialize(base, delta, whole)
    assert _digest_of(whole) == source.digest()
    assert _digest_of(base) == before


def test_a_delta_that_is_not_one_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "memory.delta"
    bogus.write_bytes(b"x" * 64)
    with pytest.raises(guestram.RamError):
        read_index(bogus)


def test_which_ram_a_work_directory_holds(tmp_path: Path) -> None:
    state = tmp_path / "snapshot"
    state.mkdir()
    assert not guestram.maps_base(tmp_path) and not guestram.holds_ram(tmp_path, state)
    (tmp_path / guestram.BASE).write_bytes(b"")
    assert guestram.maps_base(tmp_path)
    assert not guestram.holds_ram(tmp_path, state)  # a base without its delta is not whole
    (state / guestram.DELTA).write_bytes(b"")
    assert guestram.holds_ram(tmp_path, state)
    # Whole RAM of its own (a rollback or a fetch put it there) wins over a base.
    (tmp_path / guestram.OWN).write_bytes(b"")
    assert not guestram.maps_base(tmp_path)
    guestram.drop(tmp_path)
    assert not guestram.holds_ram(tmp_path, state)


@pytest.mark.skipif(os.geteuid() != 0, reason="reads another process's pagemap and memory")
def test_a_served_base_is_mapped_through_its_link(tmp_path: Path, mappers: list[_Mapper]) -> None:
    """RAM served from elsewhere is a link to it with an empty delta: clones link to the
    same file, and written pages are found in a mapping opened through the link."""
    (tmp_path / "served").mkdir()
    served = _base(tmp_path / "served")
    work, state, clone = tmp_path / "work", tmp_path / "work" / "snapshot", tmp_path / "clone"
    for directory in (work, state, clone):
        directory.mkdir()
    guestram.serve_base(served, work, state)
    assert guestram.holds_ram(work, state) and read_index(state / guestram.DELTA) == []
    assert guestram.link_base(work / guestram.BASE, clone)
    assert (clone / guestram.BASE).readlink() == served
    mapper = _Mapper(clone / guestram.BASE, [5])
    mappers.append(mapper)
    assert save_delta(mapper.proc.pid, clone / guestram.BASE, clone / guestram.DELTA) == 1
    whole = tmp_path / "whole"
    materialize(clone / guestram.BASE, clone / guestram.DELTA, whole)
    assert _digest_of(whole) == mapper.digest()
