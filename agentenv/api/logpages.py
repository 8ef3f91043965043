"""E2B's pages of log lines, for builds and sandboxes alike: forward from a cursor (ms
since the epoch), oldest first, or back from it, newest first."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

T = TypeVar("T")
Direction = Literal["forward", "backward"]


def log_page(
    lines: Sequence[T],
    ms_of: Callable[[T], int],
    cursor: int | None,
    direction: Direction,
    limit: int,
) -> list[T]:
    """`lines` (oldest first) from `cursor` in `direction`, at most `limit` of them; no
    cursor starts at the oldest (forward) or the newest (backward)."""
    if direction == "forward":
        chosen = [line for line in lines if cursor is None or ms_of(line) >= cursor]
    else:
        chosen = [line for line in reversed(lines) if cursor is None or ms_of(line) <= cursor]
    return chosen[:limit]
