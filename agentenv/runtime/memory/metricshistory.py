"""Each sandbox's recent guest metrics, for `GET /sandboxes/{id}/metrics?start=&end=`.

Samples come from the node's memory sampling (every `sandbox.memory_sample_interval`)
and from every metrics request; kept in memory, the last `KEEP` per sandbox.
"""

from __future__ import annotations

from collections import deque
from typing import Any

# An hour at the default sampling interval.
KEEP = 240


class MetricsHistory:
    """Guest samples (the agent's `/metrics` answers, keyed by their `ts`) per sandbox."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._samples: dict[str, deque[dict[str, Any]]] = {}

    def record(self, sandbox_id: str, sample: dict[str, Any]) -> None:
        samples = self._samples.setdefault(sandbox_id, deque(maxlen=self._keep))
        # One per second at most: a burst of requests adds nothing new.
        if samples and int(samples[-1]["ts"]) >= int(sample["ts"]):
            samples[-1] = sample
        else:
            samples.append(sample)

    def between(self, sandbox_id: str, start: int | None, end: int | None) -> list[dict[str, Any]]:
        """Samples with `start <= ts <= end` (either bound may be open), oldest first."""
        return [
            s
            for s in self._samples.get(sandbox_id, ())
            if (start is None or int(s["ts"]) >= start) and (end is None or int(s["ts"]) <= end)
        ]

    def forget(self, sandbox_id: str) -> None:
        self._samples.pop(sandbox_id, None)
