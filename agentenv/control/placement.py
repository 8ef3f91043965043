"""Placement: which nodes may take a new sandbox (or a moving paused one), best first.

Capacity and admission first: only active nodes that heartbeat recently and have room
for the sandbox's memory are candidates (the node's own admission stays the final word,
and the control plane tries the next candidate when a node refuses). Room counts what a
node last reported plus what was placed on it since (`Reserved`, from the placement
ledger), so a burst of creates sees each other before any heartbeat does.

Then locality: a node that already holds what the sandbox starts from (the snapshot's
files, the template's disk stack in its block daemon, the paused sandbox's files) reads
nothing from the object store, while what is promised on it is below `LOCAL_LOAD_LIMIT`
and, for a template's disk alone, less than `LOCALITY_MARGIN` above the least promised
candidate's (not its CPU
load: nodes sharing a host report one load average, and a busy CPU is best met by
reading nothing). Then spread:
the least loaded node, where load is the most used of its memory, its committed vCPUs
and its CPU (run queue per core); then the least promised (memory and vCPUs, which a
load average shared by nodes of one host cannot tell apart); ties are broken by a hash
of the request's key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..state.nodes import NodeInfo

# A node holding the content is preferred while what is promised on it is below this;
# past it, it competes on load like any other (a popular template would otherwise fill its first
# nodes to the brim while others idle).
LOCAL_LOAD_LIMIT = 0.75
# Nor while it is promised this much more than the least promised candidate: a burst
# would otherwise pile onto the few nodes whose heartbeat already shows the template.
LOCALITY_MARGIN = 0.125
# Committed vCPUs per core at which a node counts as full on CPU: agents idle most of
# the time, so vCPUs are overcommitted; past this they queue for the cores.
VCPUS_PER_CORE = 4


@dataclass(frozen=True)
class Wanted:
    """What a placement is for."""

    memory_mb: int
    vcpus: int = 1
    # Spreads ties between equal nodes (a template id, a sandbox id).
    key: str = ""
    # Local content that makes a node the better choice: snapshot ids, layer ids.
    snapshots: frozenset[str] = field(default_factory=frozenset)
    layers: frozenset[str] = field(default_factory=frozenset)
    # A node that held the sandbox before (its files may still be there).
    origin: str | None = None


@dataclass(frozen=True)
class Reserved:
    """Placed on a node since its last heartbeat: not in what it reported yet."""

    memory_mb: int = 0
    vcpus: int = 0


NOTHING = Reserved()


def up(node: NodeInfo, now: float, timeout: float) -> bool:
    """Whether `node` takes new sandboxes: active, and heard from within `timeout`."""
    return node.state.places and node.silent_for(now) < timeout


def candidates(
    nodes: list[NodeInfo],
    wanted: Wanted,
    now: float,
    timeout: float,
    reserved: Mapping[str, Reserved] | None = None,
) -> list[NodeInfo]:
    """Nodes that may take `wanted`, best first."""
    held = reserved or {}
    fit = [
        n
        for n in nodes
        if up(n, now, timeout) and free_memory_mb(n, held.get(n.name, NOTHING)) >= wanted.memory_mb
    ]
    least = min((commitment(n, held.get(n.name, NOTHING)) for n in fit), default=0.0)
    limit = min(LOCAL_LOAD_LIMIT, least + LOCALITY_MARGIN)
    return sorted(fit, key=lambda n: _rank(n, wanted, held.get(n.name, NOTHING), limit))


def free_memory_mb(node: NodeInfo, held: Reserved) -> int:
    return node.capacity.free_memory_mb - held.memory_mb


def load(node: NodeInfo, held: Reserved) -> float:
    """How full the node is (1.0: full): the most used of memory, committed vCPUs and
    its CPU."""
    return max(commitment(node, held), node.capacity.cpu_load)


def commitment(node: NodeInfo, held: Reserved) -> float:
    """What is promised on the node (1.0: all of it): the more of memory and vCPUs."""
    capacity = node.capacity
    if capacity.memory_mb <= 0:
        return 1.0
    memory = (capacity.committed_memory_mb + held.memory_mb) / capacity.memory_mb
    cores = max(capacity.cores, 1)
    vcpus = (capacity.committed_vcpus + held.vcpus) / (cores * VCPUS_PER_CORE)
    return max(memory, vcpus)


def _rank(
    node: NodeInfo, wanted: Wanted, held: Reserved, disk_limit: float
) -> tuple[int, float, float, int]:
    capacity = node.capacity
    full = load(node, held)
    # A snapshot's or a paused sandbox's files (its whole RAM) cost far more to fetch than
    # a template's disk, which is read lazily: only the disk's preference is held to the
    # margin over the least promised node.
    holds_state = node.name == wanted.origin or any(
        s in capacity.snapshot_set for s in wanted.snapshots
    )
    holds_disk = any(layer in capacity.layer_set for layer in wanted.layers)
    limit = LOCAL_LOAD_LIMIT if holds_state else disk_limit
    local = (holds_state or holds_disk) and commitment(node, held) < limit
    # Any stable mix of key and node will do: it only orders equals.
    tie = hash((wanted.key, node.name))
    # Between nodes equally loaded on CPU (nodes sharing a host report one load average),
    # the one with less promised, placements since its heartbeat included, comes first.
    return (0 if local else 1, full, commitment(node, held), tie)
