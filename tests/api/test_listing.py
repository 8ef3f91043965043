"""Sandbox listings: each filter E2B's SDKs send, the order and the cursor, without a server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi import Response

from agentenv.api.listing import list_query, listed_page, listed_page_of
from agentenv.errors import InvalidInput
from agentenv.state.lifecycle import State
from agentenv.state.sandboxes import SandboxRecord

T0 = datetime(2026, 12, 4, 12, 0, 0, 123456, tzinfo=UTC)


def record(
    sandbox_id: str, seconds: int, template: str = "base", state: State = State.RUNNING, **extra
) -> SandboxRecord:
    started = T0 + timedelta(seconds=seconds)
    end = started + timedelta(hours=1)
    return SandboxRecord(sandbox_id, template, state, started, end, 1, 256, 0, 0, **extra)


RECORDS = [
    record("ia", 0, metadata={"run": "1"}),
    record("ib", 1, template="tpl123", alias="python", metadata={"run": "1"}),
    record("ic", 2, state=State.PAUSED),
]


def ids(**params) -> list[str]:
    return [s.sandboxID for s in listed_page(RECORDS, Response(), list_query(**params))]


def test_filters() -> None:
    assert ids() == ["ic", "ib", "ia"]
    assert ids(order="asc") == ["ia", "ib", "ic"]
    assert ids(metadata="run=1") == ["ib", "ia"]
    assert ids(state=["paused"]) == ["ic"]
    assert ids(state=["running,paused"]) == ["ic", "ib", "ia"]
    # At or after, to the microsecond; a time without a zone is UTC.
    assert ids(startedAfter=T0 + timedelta(seconds=1)) == ["ic", "ib"]
    assert ids(startedAfter=(T0 + timedelta(seconds=1, microseconds=1))) == ["ic"]
    assert ids(startedAfter=(T0 + timedelta(seconds=2)).replace(tzinfo=None)) == ["ic"]
    # A template's id or its alias.
    assert ids(template="tpl123") == ids(template="python") == ["ib"]
    assert ids(template="unknown-template") == []


def test_pages_follow_the_cursor() -> None:
    response = Response()
    first = listed_page(RECORDS, response, list_query(limit=2))
    token = response.headers["x-next-token"]
    rest = listed_page(RECORDS, Response(), list_query(limit=2, nextToken=token))
    assert [s.sandboxID for s in first + rest] == ["ic", "ib", "ia"]


def test_an_unknown_state_is_refused() -> None:
    with pytest.raises(InvalidInput, match="unknown state filter"):
        list_query(state=["running,sleeping"])


async def test_a_store_read_a_page_at_a_time_lists_the_same() -> None:
    """`listed_page_of` (the control plane's, over a store too large to read whole) pages
    exactly as `listed_page` does, also when filters drop whole reads."""
    many = [record(f"i{n:02d}", n % 7, metadata={"run": str(n % 3)}) for n in range(30)]
    many += RECORDS

    async def read(after, limit, *, descending=False, states=()):
        ordered = sorted(many, key=lambda r: (r.started_at, r.sandbox_id), reverse=descending)
        if after is not None:
            ordered = [r for r in ordered
                       if ((r.started_at, r.sandbox_id) < after if descending
                           else (r.started_at, r.sandbox_id) > after)]  # fmt: skip
        return [r for r in ordered if not states or r.state in states][:limit]

    for params in ({}, {"order": "asc"}, {"metadata": "run=2"}, {"state": ["paused"]}):
        for limit in (1, 4, 100):
            pages, whole, token = [], [], None
            while True:
                query = list_query(**params, limit=limit, nextToken=token)
                response = Response()
                got = await listed_page_of(read, response, query)
                expected = listed_page(many, Response(), query)
                assert [s.sandboxID for s in got] == [s.sandboxID for s in expected]
                pages.append(got)
                whole += [s.sandboxID for s in got]
                token = response.headers.get("x-next-token")
                if not token:
                    break
            everything = listed_page(many, Response(), list_query(**params, limit=100))
            assert whole == [s.sandboxID for s in everything][: len(whole)]
