"""QEMU's migration stream, read only as far as needed to splice a saved device state
onto the head of another stream of the same machine.

A VM whose RAM is a private mapping of a snapshot cannot be saved by `migrate` without
sending all of its RAM, so its pause saves device sections alone
(`xen-save-devices-state`). Loading those needs the stream's head (configuration and RAM
block list), taken from the snapshot the VM was restored from: the head ends where the
first device section begins.
"""

from __future__ import annotations

import struct

MAGIC = b"QEVM"
_HEADER = 8  # magic + be32 version
_PAGE = 4096

# Section types (migration/savevm.c).
_START, _PART, _END, _FULL, _SUBSECTION, _CONFIGURATION, _COMMAND = 1, 2, 3, 4, 5, 7, 8
_FOOTER = 0x7E
# RAM record flags (migration/ram.c), in the low bits of each record's be64 address.
_ZERO, _MEM_SIZE, _PAGE_DATA, _EOS, _CONTINUE = 0x02, 0x04, 0x08, 0x10, 0x20
_FLAG_MASK = 0xFFF


class StreamError(ValueError):
    """The stream is not one this reader understands."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise StreamError(f"stream ends at {len(self.data)}, wanted {self.at + size}")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def u8(self) -> int:
        return self.take(1)[0]

    def be16(self) -> int:
        return int(struct.unpack(">H", self.take(2))[0])

    def be32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def be64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def name(self) -> bytes:
        return self.take(self.u8())


def device_sections_offset(stream: bytes) -> int:
    """Where the first device section (a FULL section) of a saved state begins."""
    reader = _Reader(stream)
    if reader.take(4) != MAGIC:
        raise StreamError("not a QEMU migration stream")
    reader.be32()
    while True:
        kind = reader.u8()
        if kind == _FULL:
            return reader.at - 1
        if kind == _CONFIGURATION:
            _configuration(reader)
        elif kind == _START:
            reader.be32()
            idstr = reader.name()
            reader.be32(), reader.be32()  # instance, version
            if idstr != b"ram":
                raise StreamError(f"unexpected iterative section {idstr!r}")
            _ram_records(reader)
            _footer(reader)
        elif kind in (_PART, _END):
            reader.be32()
            _ram_records(reader)
            _footer(reader)
        elif kind == _COMMAND:
            reader.be16()
            reader.take(reader.be16())
        else:
            raise StreamError(f"unexpected section type {kind} at {reader.at - 1}")


def head(stream: bytes) -> bytes:
    """The part of a saved state before its device sections."""
    return stream[: device_sections_offset(stream)]


def splice(stream_head: bytes, device_state: bytes) -> bytes:
    """A whole stream: a `head`, then the device sections of `device_state` (a stream
    `xen-save-devices-state` wrote, of the same machine)."""
    if stream_head[:4] != MAGIC or device_state[:4] != MAGIC:
        raise StreamError("not a QEMU migration stream")
    return stream_head + device_state[_HEADER:]


def _configuration(reader: _Reader) -> None:
    reader.take(reader.be32())  # the machine type's name
    while reader.data[reader.at] == _SUBSECTION:
        reader.u8()
        name = reader.name()
        reader.be32()  # version
        if name == b"configuration/capabilities":
            for _ in range(reader.be32()):
                reader.name()
        elif name == b"configuration/page-size":
            reader.be32()
        else:
            raise StreamError(f"unexpected configuration subsection {name!r}")


def _ram_records(reader: _Reader) -> None:
    while True:
        record = reader.be64()
        flags = record & _FLAG_MASK
        if flags & _EOS:
            return
        if flags & _MEM_SIZE:
            total, seen = record & ~_FLAG_MASK, 0
            while seen < total:
                reader.name()
                seen += reader.be64()
                reader.be64()  # the block's guest address (x-ignore-shared)
        elif flags & (_ZERO | _PAGE_DATA):
            if not flags & _CONTINUE:
                reader.name()
            reader.take(1 if flags & _ZERO else _PAGE)
        else:
            raise StreamError(f"unexpected RAM record flags {flags:#x}")


def _footer(reader: _Reader) -> None:
    if reader.u8() != _FOOTER:
        raise StreamError(f"no section footer at {reader.at - 1}")
    reader.be32()
