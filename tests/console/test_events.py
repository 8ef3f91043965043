"""The console's list stream: the whole list once, then only what moved."""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping
from typing import Any

from agentenv.console.events import list_events


class ScriptedFeed:
    """A list whose versions change as the test scripts them, tick by tick."""

    def __init__(self, ticks: list[dict[str, int]]) -> None:
        self.ticks = ticks
        self.rows_asked: list[list[str]] = []

    async def versions(self) -> Mapping[str, Hashable]:
        return self.ticks.pop(0) if len(self.ticks) > 1 else self.ticks[0]

    async def rows(self, ids: list[str]) -> list[dict[str, Any]]:
        self.rows_asked.append(sorted(ids))
        return [{"sandboxID": i} for i in sorted(ids)]


def parse(raw: bytes) -> tuple[str, Any]:
    text = raw.decode()
    if text.startswith(":"):
        return "comment", None
    name, data = text.strip().split("\n")
    return name.removeprefix("event: "), json.loads(data.removeprefix("data: "))


async def test_a_snapshot_then_only_rows_that_moved_and_ids_that_went() -> None:
    feed = ScriptedFeed([{"a": 1, "b": 1}, {"a": 1, "b": 2, "c": 1}, {"b": 2, "c": 1}])
    stream = list_events(feed, tick=0, keepalive=3600)
    assert parse(await anext(stream)) == (
        "snapshot",
        {"sandboxes": [{"sandboxID": "a"}, {"sandboxID": "b"}]},
    )
    assert parse(await anext(stream)) == (
        "change",
        {"upsert": [{"sandboxID": "b"}, {"sandboxID": "c"}], "remove": []},
    )
    assert parse(await anext(stream)) == ("change", {"upsert": [], "remove": ["a"]})
    assert feed.rows_asked == [["a", "b"], ["b", "c"], []]
    await stream.aclose()


async def test_an_idle_list_reads_no_rows_and_keeps_the_stream_open() -> None:
    feed = ScriptedFeed([{"a": 1}])
    stream = list_events(feed, tick=0, keepalive=0)
    assert parse(await anext(stream))[0] == "snapshot"
    assert parse(await anext(stream)) == ("comment", None)
    assert feed.rows_asked == [["a"]]
    await stream.aclose()
