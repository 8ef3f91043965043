"""The migration-stream reader on streams built the way QEMU writes them (a real one is
spliced and loaded in the e2e suite every time a clone pauses)."""

from __future__ import annotations

import struct

import pytest

from agentenv.vmm.migstream import StreamError, device_sections_offset, head, splice


def _name(text: bytes) -> bytes:
    return bytes([len(text)]) + text


def _ram(*records: bytes) -> bytes:
    return b"".join(records) + struct.pack(">Q", 0x10)  # EOS


def _footer(section: int) -> bytes:
    return b"\x7e" + struct.pack(">I", section)


def _stream_head() -> bytes:
    config = b"\x07" + struct.pack(">I", 7) + b"microvm"
    config += b"\x05" + _name(b"configuration/capabilities") + struct.pack(">I", 1)
    config += struct.pack(">I", 1) + _name(b"x-ignore-shared")
    config += b"\x05" + _name(b"configuration/page-size") + struct.pack(">II", 1, 4096)
    mem_size = struct.pack(">Q", (256 << 20) | 0x04) + _name(b"ram")
    mem_size += struct.pack(">QQ", 256 << 20, 0)
    rom_page = struct.pack(">Q", 0x08) + _name(b"rom") + bytes(range(256)) * 16
    zero_next = struct.pack(">Q", 0x1000 | 0x02 | 0x20) + b"\0"
    start = b"\x01" + struct.pack(">I", 1) + _name(b"ram") + struct.pack(">II", 0, 4)
    start += _ram(mem_size, rom_page, zero_next) + _footer(1)
    part = b"\x02" + struct.pack(">I", 1) + _ram() + _footer(1)
    command = b"\x08" + struct.pack(">HH", 0x0B, 0)
    end = b"\x03" + struct.pack(">I", 1) + _ram() + _footer(1)
    return b"QEVM" + struct.pack(">I", 3) + config + start + part + command + end


def _devices(payload: bytes) -> bytes:
    section = b"\x04" + struct.pack(">I", 2) + _name(b"timer") + struct.pack(">II", 0, 2)
    return section + payload + _footer(2) + b"\0"


def test_the_head_ends_where_the_first_device_section_begins() -> None:
    stream = _stream_head() + _devices(b"old")
    assert device_sections_offset(stream) == len(_stream_head())
    assert head(stream) == _stream_head()


def test_splice_puts_a_new_device_state_after_the_head() -> None:
    saved = b"QEVM" + struct.pack(">I", 3) + _devices(b"new")
    spliced = splice(head(_stream_head() + _devices(b"old")), saved)
    assert spliced == _stream_head() + _devices(b"new")
    assert device_sections_offset(spliced) == len(_stream_head())


@pytest.mark.parametrize(
    "stream",
    [
        b"NOPE" + bytes(8),
        _stream_head()[:40],  # cut short inside the RAM section
        _stream_head().replace(b"\x08\x00\x0b", b"\x09\x00\x0b"),  # a section type unknown here
    ],
)
def test_streams_it_does_not_understand_are_refused(stream: bytes) -> None:
    with pytest.raises(StreamError):
        device_sections_offset(stream)


def test_splice_refuses_what_is_not_a_stream() -> None:
    with pytest.raises(StreamError):
        splice(_stream_head(), b"garbage")
