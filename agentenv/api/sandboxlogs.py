"""A sandbox's logs, as E2B's two routes serve them (`docs/e2b-compatibility.md`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query

from ..images.builds import LEVELS, LogLevel
from .deps import ManagerDep
from .errors import ERROR_RESPONSES
from .logpages import Direction, log_page
from .models import SandboxLogEntry, SandboxLogLine, SandboxLogs, SandboxLogsV2

router = APIRouter(responses=ERROR_RESPONSES)


def _entry(raw: dict[str, Any]) -> SandboxLogEntry:
    return SandboxLogEntry(
        timestamp=datetime.fromtimestamp(raw["timestampMs"] / 1000, UTC),
        level=raw["level"],
        message=raw["message"],
        fields=raw["fields"],
    )


@router.get("/sandboxes/{sandbox_id}/logs")
async def sandbox_logs(
    manager: ManagerDep,
    sandbox_id: str,
    start: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=0, le=10_000)] = 1000,
) -> SandboxLogs:
    """E2B's first route (its CLI's `e2b sandbox logs`): from `start` (ms), oldest first."""
    raw = (await manager.logs(sandbox_id, start))[:limit]
    lines = [
        SandboxLogLine(
            timestamp=_entry(r).timestamp,
            line=json.dumps(
                {"level": r["level"], "logger": r["logger"], "message": r["message"], **r["fields"]}
            ),
        )
        for r in raw
    ]
    return SandboxLogs(logs=lines, logEntries=[_entry(r) for r in raw])


@router.get("/v2/sandboxes/{sandbox_id}/logs")
async def sandbox_logs_v2(
    manager: ManagerDep,
    sandbox_id: str,
    cursor: Annotated[int | None, Query(ge=0)] = None,
    limit: Annotated[int, Query(ge=0, le=1000)] = 1000,
    direction: Direction = "forward",
    level: LogLevel | None = None,
    search: Annotated[str | None, Query(max_length=256)] = None,
) -> SandboxLogsV2:
    """Forward: entries at or after `cursor` (ms), oldest first; backward: at or before it
    (default: now), newest first. `level` is the lowest kept; `search` a substring."""
    floor = LEVELS.index(level) if level else 0
    kept = [
        r
        for r in await manager.logs(sandbox_id)
        if LEVELS.index(r["level"]) >= floor and (search is None or search in r["message"])
    ]
    page = log_page(kept, lambda r: r["timestampMs"], cursor, direction, limit)
    return SandboxLogsV2(logs=[_entry(r) for r in page])
