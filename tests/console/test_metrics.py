"""The metrics page's data: operations as bucket counts, nodes' histograms summed, and
the density history that survives a failed sample."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Histogram

from agentenv.console.metrics import (
    DensityHistory,
    DensityPoint,
    density_of,
    merged,
    operation_histograms,
)
from agentenv.state.nodes import NodeCapacity


def histogram_of(durations: dict[tuple[str, str], list[float]]) -> Histogram:
    made = Histogram(
        "aenv_operation_seconds", "", ["operation", "outcome"], buckets=(0.1, 1.0),
        registry=CollectorRegistry(),
    )  # fmt: skip
    for (operation, outcome), values in durations.items():
        for value in values:
            made.labels(operation, outcome).observe(value)
    return made


def test_successful_durations_become_cumulative_buckets() -> None:
    made = histogram_of({("create", "ok"): [0.05, 0.5, 3.0], ("create", "error"): [0.01]})
    found = operation_histograms(made.collect())
    assert found == {
        "create": {"le": [0.1, 1.0, None], "counts": [1, 2, 3], "count": 3, "sum": 3.55}
    }


def test_nodes_histograms_add_up() -> None:
    one = operation_histograms(histogram_of({("pause", "ok"): [0.05]}).collect())
    two = operation_histograms(histogram_of({("pause", "ok"): [0.5, 0.6]}).collect())
    total = merged([one, two, {}])
    assert total["pause"]["counts"] == [1, 3, 3]
    assert total["pause"]["count"] == 3


def test_density_sums_nodes_and_keeps_sampling_past_a_failure() -> None:
    point = density_of(
        [NodeCapacity(memory_mb=1000, committed_memory_mb=300, running=2, paused=1)] * 2
    )
    assert (point.nodes, point.running, point.paused, point.committed_memory_mb) == (
        2, 4, 2, 600,
    )  # fmt: skip
    answers: list[DensityPoint | Exception] = [RuntimeError("store down"), point, point]

    async def three_ticks() -> list[dict[str, object]]:
        done = asyncio.Event()

        async def sample() -> DensityPoint:
            answer = answers.pop(0)
            if not answers:
                done.set()
            if isinstance(answer, Exception):
                raise answer
            return answer

        history = DensityHistory(sample)
        task = asyncio.create_task(history.run(every=0))
        await done.wait()
        task.cancel()
        return history.points()

    points = asyncio.run(three_ticks())
    assert [p["running"] for p in points] == [4, 4]
