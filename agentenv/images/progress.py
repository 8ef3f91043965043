"""Pull progress lines: one format, written by the puller and read by its displays."""

from __future__ import annotations

import re
from dataclasses import dataclass

_BYTES = re.compile(r"^(?P<label>.*): (?P<done>\d+)/(?P<total>\d+) bytes$")


@dataclass(frozen=True)
class ByteProgress:
    label: str
    done: int
    total: int


def byte_progress(label: str, done: int, total: int) -> str:
    return f"{label}: {done}/{total} bytes"


def parse_byte_progress(line: str) -> ByteProgress | None:
    """The download counter in a progress line, or None for any other line."""
    match = _BYTES.match(line)
    if match is None:
        return None
    return ByteProgress(match["label"], int(match["done"]), int(match["total"]))
