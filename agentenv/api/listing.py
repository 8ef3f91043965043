"""Sandbox listings as E2B pages them: filters, order and `nextToken` cursors."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Protocol
from urllib.parse import parse_qsl, unquote

from fastapi import Query, Response

from ..errors import InvalidInput
from ..guest.agent import ENVD_VERSION
from ..state.lifecycle import PUBLIC_STATE, State
from ..state.sandboxes import SandboxRecord
from .models import ListedSandbox
from .pagination import decode_cursor, encode_cursor

CLIENT_ID = "aenv"


@dataclass(frozen=True)
class ListQuery:
    """`GET /v2/sandboxes`'s query: every filter must hold for a sandbox to be listed."""

    metadata: dict[str, str]
    states: set[str]
    started_after: datetime | None
    template: str | None
    limit: int
    next_token: str | None
    order: str

    def admits(self, record: SandboxRecord) -> bool:
        return (
            (not self.states or PUBLIC_STATE[record.state] in self.states)
            and all(record.metadata.get(k) == v for k, v in self.metadata.items())
            and (self.started_after is None or record.started_at >= self.started_after)
            # E2B's filter takes a template's id or its alias.
            and (self.template is None or self.template in (record.template_id, record.alias))
        )


def list_query(
    metadata: str | None = None,
    state: Annotated[list[str] | None, Query()] = None,
    startedAfter: datetime | None = None,
    template: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 100,
    nextToken: str | None = None,
    # E2B's default: the newest first (its SDKs page through `limit=1` that way).
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> ListQuery:
    """The query parameters, checked (a FastAPI dependency of both listing routes)."""
    states = {s for value in state or [] for s in value.split(",") if s}
    if states - {"running", "paused"}:
        raise InvalidInput(f"unknown state filter: {sorted(states)}")
    if startedAfter is not None and startedAfter.tzinfo is None:
        startedAfter = startedAfter.replace(tzinfo=UTC)  # as E2B reads a time with no zone
    return ListQuery(
        parse_metadata_filter(metadata), states, startedAfter, template, limit, nextToken, order
    )


def listed_fields(record: SandboxRecord) -> dict[str, Any]:
    return {
        "templateID": record.template_id,
        "alias": record.alias,
        "sandboxID": record.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": record.started_at,
        "endAt": record.end_at,
        "cpuCount": record.vcpus,
        "memoryMB": record.memory_mb,
        "diskSizeMB": record.disk_mb,
        "metadata": record.metadata,
        "state": PUBLIC_STATE[record.state],
        "envdVersion": ENVD_VERSION,
        "node": record.node or None,
        "volumeMounts": [{"name": m["name"], "path": m["path"]} for m in record.volume_mounts],
        # E2B's: true, or omitted (a running sandbox, an agent that answered at pause).
        "envdUnresponsiveAtPause": (
            PUBLIC_STATE[record.state] == "paused" and record.saved_unresponsive_agent
        )
        or None,
    }


def parse_metadata_filter(raw: str | None) -> dict[str, str]:
    """The SDK percent-encodes keys and values, then the pair list: undo both layers."""
    if not raw:
        return {}
    return {unquote(k): unquote(v) for k, v in parse_qsl(raw, keep_blank_values=True)}


def listed_page(
    records: list[SandboxRecord], response: Response, query: ListQuery
) -> list[ListedSandbox]:
    """One page of `GET /v2/sandboxes` over `records`, filtered and in E2B's order; the
    next page's token goes in `x-next-token`."""
    records = [r for r in records if query.admits(r)]
    descending = query.order == "desc"
    records.sort(key=lambda r: (r.started_at, r.sandbox_id), reverse=descending)
    if query.next_token:
        cursor = decode_cursor(query.next_token)
        if descending:
            records = [r for r in records if (r.started_at, r.sandbox_id) < cursor]
        else:
            records = [r for r in records if (r.started_at, r.sandbox_id) > cursor]
    page = records[: query.limit]
    if len(records) > query.limit:
        response.headers["x-next-token"] = encode_cursor(page[-1].started_at, page[-1].sandbox_id)
    return [ListedSandbox(**listed_fields(r)) for r in page]


class PageReader(Protocol):
    """A store's records in listing order from a cursor (`SqlSandboxStore.page`)."""

    async def __call__(
        self,
        after: tuple[datetime, str] | None,
        limit: int,
        *,
        descending: bool = False,
        states: Collection[State] = (),
    ) -> list[SandboxRecord]: ...


async def listed_page_of(
    read: PageReader, response: Response, query: ListQuery
) -> list[ListedSandbox]:
    """`listed_page` over a store too large to read whole: from the cursor on, a page and
    one more at a time, until a page and one more pass the filters or the store ends."""
    states = [
        s for s in State if s.visible and (not query.states or PUBLIC_STATE[s] in query.states)
    ]
    after = decode_cursor(query.next_token) if query.next_token else None
    descending = query.order == "desc"
    found: list[SandboxRecord] = []
    while len(found) <= query.limit:
        read_now = await read(after, query.limit + 1, descending=descending, states=states)
        found += [r for r in read_now if query.admits(r)]
        if len(read_now) <= query.limit:
            break
        after = (read_now[-1].started_at, read_now[-1].sandbox_id)
    page = found[: query.limit]
    if len(found) > query.limit:
        response.headers["x-next-token"] = encode_cursor(page[-1].started_at, page[-1].sandbox_id)
    return [ListedSandbox(**listed_fields(r)) for r in page]


def running_listed(records: list[SandboxRecord], metadata: str | None) -> list[ListedSandbox]:
    """`GET /sandboxes` (SDK 1.x) over `records`: running sandboxes only, unpaginated."""
    wanted_meta = parse_metadata_filter(metadata)
    return [
        ListedSandbox(**listed_fields(r))
        for r in records
        if PUBLIC_STATE[r.state] == "running"
        and all(r.metadata.get(k) == v for k, v in wanted_meta.items())
    ]
