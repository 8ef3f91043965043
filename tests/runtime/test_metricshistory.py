"""A sandbox's recent guest metrics, by time range."""

from __future__ import annotations

from agentenv.runtime.memory.metricshistory import MetricsHistory


def _sample(ts: int, used: int = 1) -> dict[str, int]:
    return {"ts": ts, "mem_used": used}


def test_samples_in_a_range_oldest_first_and_bounded() -> None:
    history = MetricsHistory(keep=3)
    for ts in (100, 105, 110, 115):
        history.record("a", _sample(ts))
    # The oldest went; bounds are inclusive and either may be open.
    assert [s["ts"] for s in history.between("a", None, None)] == [105, 110, 115]
    assert [s["ts"] for s in history.between("a", 105, 110)] == [105, 110]
    assert history.between("a", 0, 50) == [] and history.between("other", None, None) == []
    # A sample of the same second replaces the last one.
    history.record("a", _sample(115, used=7))
    assert history.between("a", 115, None) == [_sample(115, used=7)]
    history.forget("a")
    assert history.between("a", None, None) == []
