"""What the console's metrics page draws: how long sandbox operations take (the
`aenv_operation_seconds` histogram, as buckets) and how densely sandboxes pack memory
over time (sampled by this process every few seconds, kept for an hour)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import Metric

from ..observe.metrics import OPERATION_SECONDS
from ..state.nodes import NodeCapacity

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 10.0
# An hour of samples.
HISTORY_POINTS = 360
# The bucket counts of each operation (`create`, `resume`, `pause`, …), successful ones.
Histograms = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class DensityPoint:
    """The fleet at one moment: sandboxes held, and the memory they were promised."""

    t: float
    nodes: int
    running: int
    paused: int
    memory_mb: int
    committed_memory_mb: int


def density_of(capacities: Iterable[NodeCapacity]) -> DensityPoint:
    """One point summed over nodes' reports (a node's own, or every live node's)."""
    seen = list(capacities)
    return DensityPoint(
        t=time.time(),
        nodes=len(seen),
        running=sum(c.running for c in seen),
        paused=sum(c.paused for c in seen),
        memory_mb=sum(c.memory_mb for c in seen),
        committed_memory_mb=sum(c.committed_memory_mb for c in seen),
    )


class DensityHistory:
    """The last hour of density points, sampled by `run`."""

    def __init__(self, sample: Callable[[], Awaitable[DensityPoint]]) -> None:
        self._sample = sample
        self._points: deque[DensityPoint] = deque(maxlen=HISTORY_POINTS)

    async def run(self, every: float = SAMPLE_SECONDS) -> None:
        while True:
            try:
                self._points.append(await self._sample())
            except Exception:
                log.exception("sampling the console's density failed")
            await asyncio.sleep(every)

    def points(self) -> list[dict[str, Any]]:
        return [asdict(p) for p in self._points]


def operation_histograms(metrics: Iterable[Metric] | None = None) -> Histograms:
    """Each operation's successful durations as cumulative bucket counts (`le`, `counts`),
    with their `count` and `sum`; from this process's histogram unless `metrics` given."""
    found: Histograms = {}
    for metric in OPERATION_SECONDS.collect() if metrics is None else metrics:
        for sample in metric.samples:
            if sample.labels.get("outcome") != "ok":
                continue
            entry = found.setdefault(
                sample.labels["operation"], {"le": [], "counts": [], "count": 0, "sum": 0.0}
            )
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                entry["le"].append(None if math.isinf(bound) else bound)
                entry["counts"].append(int(sample.value))
            elif sample.name.endswith("_count"):
                entry["count"] = int(sample.value)
            elif sample.name.endswith("_sum"):
                entry["sum"] = sample.value
    return found


def merged(parts: Iterable[Histograms]) -> Histograms:
    """Nodes' histograms as one (they share their buckets: the same code made them)."""
    total: Histograms = {}
    for part in parts:
        for operation, entry in part.items():
            into = total.setdefault(
                operation,
                {"le": entry["le"], "counts": [0] * len(entry["counts"]), "count": 0, "sum": 0.0},
            )
            if into["le"] != entry["le"]:
                continue  # another version's buckets: not comparable
            into["counts"] = [a + b for a, b in zip(into["counts"], entry["counts"], strict=True)]
            into["count"] += entry["count"]
            into["sum"] += entry["sum"]
    return total
