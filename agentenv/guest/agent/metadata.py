"""User metadata on files (envd 0.6.2): `X-Metadata-<key>` upload headers kept as
`user.e2b.<key>` extended attributes, and read back into every EntryInfo."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable

XATTR_PREFIX = "user.e2b."
HEADER_PREFIX = "x-metadata-"
# The kernel caps an xattr name at 255 bytes; ext4 keeps all of an inode's xattrs in one
# 4 KiB block, so the whole set is bounded before any is written.
MAX_KEY_BYTES = 255 - len(XATTR_PREFIX)
MAX_TOTAL_BYTES = 4096
# procfs, sysfs and the like: the file is written, its metadata is not kept.
UNSUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP)


class InvalidMetadata(ValueError):
    """A metadata set envd would refuse with 400, in its words."""


def from_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """`X-Metadata-*` headers as keys (lower-cased, prefix removed); a key's first value wins."""
    metadata: dict[str, str] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered.startswith(HEADER_PREFIX) and lowered != HEADER_PREFIX:
            metadata.setdefault(lowered[len(HEADER_PREFIX) :], value)
    return metadata


def validate(metadata: dict[str, str]) -> None:
    total = 0
    for key, value in metadata.items():
        if not key:
            raise InvalidMetadata("metadata key must not be empty")
        if len(key.encode()) > MAX_KEY_BYTES:
            raise InvalidMetadata(f"metadata key {key!r} exceeds {MAX_KEY_BYTES} bytes")
        _printable(f"metadata key {key!r}", key)
        _printable(f"metadata value for key {key!r}", value)
        total += len(XATTR_PREFIX) + len(key) + len(value)
    if total > MAX_TOTAL_BYTES:
        raise InvalidMetadata(f"total metadata size {total} exceeds {MAX_TOTAL_BYTES} bytes")


def _printable(label: str, text: str) -> None:
    for offset, char in enumerate(text):
        if not " " <= char <= "~":
            raise InvalidMetadata(f"{label} contains a non-printable-ASCII character at {offset}")


def replace(fd: int, metadata: dict[str, str]) -> None:
    """Make the open file's metadata exactly `metadata` (an overwrite keeps old xattrs)."""
    try:
        for name in os.listxattr(fd):
            if name.startswith(XATTR_PREFIX) and name[len(XATTR_PREFIX) :] not in metadata:
                os.removexattr(fd, name)
        for key, value in metadata.items():
            os.setxattr(fd, XATTR_PREFIX + key, value.encode())
    except OSError as err:
        # A file system without user xattrs (procfs, an older tmpfs) keeps the file only;
        # the answer reads metadata back, so it does not claim what was not kept.
        if err.errno not in UNSUPPORTED:
            raise


def read(path: str) -> dict[str, str]:
    """The metadata of `path` (not following a final symlink); entries set in the guest
    by hand that are not UTF-8 are skipped, as envd skips them."""
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return {}
    metadata: dict[str, str] = {}
    for name in names:
        if not name.startswith(XATTR_PREFIX):
            continue
        try:
            metadata[name[len(XATTR_PREFIX) :]] = os.getxattr(
                path, name, follow_symlinks=False
            ).decode()
        except (OSError, UnicodeDecodeError):
            continue
    return metadata
