"""The step cache's bound: least recently built-from entries go first, never the new one."""

from __future__ import annotations

from dataclasses import replace

from agentenv.images.buildcache import over_bound
from agentenv.images.snapshots import BUILD_CACHE, TEMPLATE

from .test_snapshots import _build


def _record(name: str, size: int, created: str, used: str = "", kind: str = BUILD_CACHE):
    day = "2026-12-07T{}:00+00:00"
    entry = _build(name, day.format(created))
    return replace(entry, tag="t", size=size, used_at=day.format(used) if used else "", kind=kind)


def test_the_least_recently_used_entries_go_until_the_rest_fit() -> None:
    old_but_used = _record("a", 300, "10:00", used="12:00")
    oldest = _record("b", 300, "10:30")
    middle = _record("c", 300, "11:00")
    newest = _record("d", 300, "11:30")
    template = _record("tpl", 5000, "09:00", kind=TEMPLATE)
    records = [old_but_used, oldest, middle, newest, template]
    assert over_bound(records, 1200, keep="d:t") == []
    assert over_bound(records, 900, keep="d:t") == [oldest]
    assert over_bound(records, 400, keep="d:t") == [oldest, middle, old_but_used]


def test_the_entry_just_taken_stays_even_alone_over_the_bound() -> None:
    records = [_record("a", 300, "10:00"), _record("b", 900, "11:00")]
    assert over_bound(records, 100, keep="b:t") == [records[0]]
    assert over_bound([records[1]], 0, keep="b:t") == []
