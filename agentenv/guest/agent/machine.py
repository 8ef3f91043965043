"""The agent's duties as the VM's own helper, done on ``/init`` when run with ``--guest``.

A sandbox VM may be a clone of a boot snapshot taken before any sandbox existed, so the
user's disk is attached, the clock set and the kernel's random generator reseeded here,
per sandbox, rather than by /init at boot.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import socket
import struct
import time
from datetime import datetime

log = logging.getLogger(__name__)

ROOTFS_LABEL = "aenv-rootfs"
_BLKFLSBUF = 0x1261
_RNDADDENTROPY = 0x40085203
_RNDRESEEDCRNG = 0x5207
_EXT4_MAGIC = 0xEF53


def ext4_label(device: str) -> str | None:
    """The volume label of the ext4 file system on `device`, or None if it holds none."""
    try:
        with open(device, "rb") as fh:
            fh.seek(1024)
            sb = fh.read(136)
    except OSError:
        return None
    if len(sb) < 136 or struct.unpack_from("<H", sb, 56)[0] != _EXT4_MAGIC:
        return None
    return sb[120:136].split(b"\0", 1)[0].decode(errors="replace")


def find_disk(label: str, sys_block: str = "/sys/class/block") -> str:
    """The /dev path of the whole disk labelled `label`; disks are not found by position."""
    for name in sorted(os.listdir(sys_block)):
        device = f"/dev/{name}"
        # The snapshot's kernel may have cached the placeholder disk's first blocks.
        _flush_buffers(device)
        if ext4_label(device) == label:
            return device
    raise FileNotFoundError(f"no disk labelled {label}")


def _flush_buffers(device: str) -> None:
    try:
        fd = os.open(device, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.ioctl(fd, _BLKFLSBUF)
    except OSError:
        pass
    finally:
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 0x2, 0x4, 0x1000, 0x4000


def mount(source: str, target: str, fstype: str, flags: int = 0, data: str = "") -> None:
    # mount(2) directly: a `mount` process per call costs ~0.2 s in an emulated guest.
    args = (source.encode(), target.encode(), fstype.encode(), flags, data.encode() or None)
    if _libc.mount(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _kernel_args(path: str = "/proc/cmdline") -> dict[str, str]:
    with open(path) as fh:
        pairs = (arg.partition("=") for arg in fh.read().split())
        return {k.removeprefix("aenv."): v for k, _, v in pairs if k.startswith("aenv.")}


def attach_rootfs(root: str) -> None:
    """Mount the user's disk at `root` with its /proc, /sys, /dev and /run; idempotent."""
    if os.path.ismount(root):
        return
    device = find_disk(ROOTFS_LABEL)
    mount(device, root, "ext4")
    for sub in ("proc", "sys", "dev", "run"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    mount("proc", f"{root}/proc", "proc")
    mount("sysfs", f"{root}/sys", "sysfs")
    # The agent's /dev, so ptys the agent opens show up inside the user's view too.
    mount("/dev", f"{root}/dev", "", MS_BIND | MS_REC)
    mount("tmpfs", f"{root}/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
    args = _kernel_args()
    hostname = args.get("hostname")
    if not hostname:
        try:
            with open(os.path.join(root, "etc/hostname")) as fh:
                hostname = fh.read().strip()
        except OSError:
            pass
    socket.sethostname(hostname or "sandbox")
    if args.get("dns"):
        resolv = os.path.join(root, "etc/resolv.conf")
        # Replace, not follow, a symlink: its target would resolve outside the rootfs.
        if os.path.islink(resolv):
            os.unlink(resolv)
        with open(resolv, "w") as fh:
            fh.write(f"nameserver {args['dns']}\n")
    log.info("attached %s at %s", device, root)


def set_clock(timestamp: str) -> None:
    """Set the wall clock from the host's RFC 3339 `timestamp` (stale after a restore)."""
    when = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    if abs(when - time.time()) > 0.5:
        time.clock_settime(time.CLOCK_REALTIME, when)


def seed_random(seed: bytes) -> None:
    """Credit host entropy and reseed now, so clones of one snapshot diverge at once."""
    if not seed:
        return
    words = (len(seed) + 3) // 4
    info = struct.pack("ii", len(seed) * 8, len(seed)) + seed.ljust(words * 4, b"\0")
    with open("/dev/urandom", "wb") as fh:
        fcntl.ioctl(fh.fileno(), _RNDADDENTROPY, info)
        fcntl.ioctl(fh.fileno(), _RNDRESEEDCRNG)
