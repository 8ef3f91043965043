"""Sandbox listings: each filter E2B's SDKs send, the order and the cursor, without a server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi import Response

from agentenv.api.listing import list_query, listed_page
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
