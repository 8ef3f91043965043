"""Rendering: aligned tables for people, JSON for programs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

SANDBOX_COLUMNS = (
    "SANDBOX ID", "TEMPLATE", "STATE", "NODE", "MEMORY", "STARTED", "ENDS", "METADATA",
)  # fmt: skip


def print_json(data: Any, out: TextIO) -> None:
    out.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by three spaces, no trailing blanks."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in (headers, *rows):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("   ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def parse_time(value: Any) -> datetime | None:
    """Parse an RFC 3339 timestamp; None if absent or malformed."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def human_duration(seconds: float) -> str:
    """Compact duration: `45s`, `3m`, `2h05m`, `3d4h`."""
    seconds = int(abs(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def relative(value: Any, now: datetime) -> str:
    """`5m ago` / `in 5m` for a timestamp, `-` when there is none."""
    when = parse_time(value)
    if when is None:
        return "-"
    delta = (when - now).total_seconds()
    return f"in {human_duration(delta)}" if delta > 0 else f"{human_duration(delta)} ago"


def sandbox_rows(items: Sequence[dict[str, Any]], now: datetime | None = None) -> list[list[str]]:
    """Table rows for `ListedSandbox` objects."""
    now = now or datetime.now(UTC)
    rows = []
    for sbx in items:
        meta = sbx.get("metadata") or {}
        rows.append(
            [
                str(sbx.get("sandboxID", "")),
                str(sbx.get("alias") or sbx.get("templateID") or ""),
                str(sbx.get("state", "")),
                str(sbx.get("node") or ""),
                _memory(sbx),
                relative(sbx.get("startedAt"), now),
                relative(sbx.get("endAt"), now),
                ",".join(f"{k}={v}" for k, v in meta.items()) if isinstance(meta, dict) else "",
            ]
        )
    return rows


def _memory(sbx: dict[str, Any]) -> str:
    """Host memory held over the guest's memory, when the node reported it."""
    held, size = sbx.get("hostMemoryMB"), sbx.get("memoryMB")
    if not isinstance(held, int):
        return ""
    return f"{held}/{size}M" if isinstance(size, int) else f"{held}M"


def print_sandboxes(
    items: Sequence[dict[str, Any]], fmt: str, out: TextIO, now: datetime | None = None
) -> None:
    """Print sandboxes as `table` or `json`."""
    if fmt == "json":
        print_json(list(items), out)
    else:
        out.write(render_table(SANDBOX_COLUMNS, sandbox_rows(items, now)))
