"""The kernel a restored VM is launched with: the real image's setup header and no more.

QEMU reads `-kernel` and `-initrd` whole into its own memory and keeps them there for a
reboot. A restored guest never boots them (and `-no-reboot` ends the VM rather than
reboot it), so each clone would hold the image (~15 MiB) for nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

# The x86 boot protocol's setup header: the setup code's size in sectors, and the magic.
_SETUP_SECTS = 0x1F1
_MAGIC = slice(0x202, 0x206)
_SECTOR = 512


def header_only(kernel: Path, directory: Path) -> Path:
    """A file in `directory` with `kernel`'s setup code and one empty sector of payload:
    enough for QEMU to accept it. `kernel` itself when it is not a bzImage."""
    status = kernel.stat()
    directory.mkdir(parents=True, exist_ok=True)
    stub = directory / f"restore-{kernel.name}-{status.st_size}-{status.st_mtime_ns}"
    if stub.exists():
        return stub
    with kernel.open("rb") as image:
        head = image.read(64 * 1024)
    if len(head) <= _SETUP_SECTS or head[_MAGIC] != b"HdrS":
        return kernel
    # Zero means four, as the boot protocol says.
    setup = ((head[_SETUP_SECTS] or 4) + 1) * _SECTOR
    if setup > len(head):
        return kernel
    partial = stub.with_name(f"{stub.name}.{os.getpid()}.tmp")
    partial.write_bytes(head[:setup] + bytes(_SECTOR))
    partial.replace(stub)
    return stub
