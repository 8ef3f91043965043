"""The header-only kernel restored VMs are launched with."""

from __future__ import annotations

from pathlib import Path

from agentenv.vmm.kernelstub import header_only


def _bzimage(path: Path, setup_sects: int, payload: int) -> bytes:
    setup = bytearray(((setup_sects or 4) + 1) * 512)  # zero means four
    setup[0x1F1] = setup_sects
    setup[0x202:0x206] = b"HdrS"
    data = bytes(setup) + b"\x90" * payload
    path.write_bytes(data)
    return data


def test_keeps_the_setup_code_and_drops_the_payload(tmp_path: Path) -> None:
    kernel = tmp_path / "vmlinuz"
    data = _bzimage(kernel, setup_sects=30, payload=1 << 20)
    stub = header_only(kernel, tmp_path / "run")
    assert stub.read_bytes() == data[: 31 * 512] + bytes(512)
    # Made once per kernel; a changed kernel gets its own.
    assert header_only(kernel, tmp_path / "run") == stub
    _bzimage(kernel, setup_sects=0, payload=4096)
    changed = header_only(kernel, tmp_path / "run")
    assert changed != stub and changed.stat().st_size == 5 * 512 + 512


def test_anything_but_a_bzimage_is_launched_as_it_is(tmp_path: Path) -> None:
    elf = tmp_path / "vmlinux"
    elf.write_bytes(b"\x7fELF" + bytes(8192))
    assert header_only(elf, tmp_path) == elf
