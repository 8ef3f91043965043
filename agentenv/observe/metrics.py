"""Prometheus metrics (`GET /metrics` on nodes and control planes).

Counters and histograms are updated where things happen; gauges that describe state
(sandboxes by state, capacity, cache) are refreshed from their sources when scraped, so
they are never stale and cost nothing between scrapes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

# Operations under TCG take seconds; under KVM, tens of milliseconds.
_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

OPERATION_SECONDS = Histogram(
    "aenv_operation_seconds",
    "Duration of sandbox operations on this node, by operation and outcome",
    ["operation", "outcome"],
    buckets=_BUCKETS,
)
SANDBOXES = Gauge("aenv_sandboxes", "Sandboxes by lifecycle state", ["state"])
CAPACITY_MB = Gauge(
    "aenv_node_memory_mb", "Memory sandboxes may commit on this node, and what they do", ["kind"]
)
DISK_MB = Gauge(
    "aenv_node_disk_mb", "Disk sandboxes may commit on this node, and what they do", ["kind"]
)
CACHE = Gauge(
    "aenv_chunk_cache", "The node's chunk cache: hits, misses, bytes fetched and held", ["kind"]
)
SANDBOX_MEMORY = Gauge(
    "aenv_sandbox_memory_bytes",
    "Running sandboxes' memory: held on the host (PSS of the VMM) and used in the guest",
    ["sandbox", "kind"],
)
MEMORY_RELIEF = Counter(
    "aenv_memory_relief_total",
    "What the node did under memory pressure: guests asked to reclaim, sandboxes paused",
    ["action"],
)
NODES = Gauge("aenv_nodes", "Nodes of the cluster by state (control plane)", ["state"])
RELAYED = Counter(
    "aenv_control_requests_total",
    "Requests the control plane sent on to nodes, by kind and status",
    ["kind", "status"],
)
STATE_STATEMENTS = Counter(
    "aenv_state_statements_total",
    "SQL statements this process sent to the state store",
)

CONTENT_TYPE = CONTENT_TYPE_LATEST


@contextlib.contextmanager
def timed(operation: str) -> Iterator[None]:
    """Record how long the block took under `operation`, and whether it raised."""
    start = time.perf_counter()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    finally:
        OPERATION_SECONDS.labels(operation, outcome).observe(time.perf_counter() - start)


def set_counts(gauge: Gauge, counts: dict[str, int], every: tuple[str, ...]) -> None:
    """Set one gauge per label value; values absent from `counts` read 0."""
    for label in every:
        gauge.labels(label).set(counts.get(label, 0))


def exposition() -> bytes:
    return generate_latest()
