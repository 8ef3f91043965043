"""Placement: which nodes may take a new sandbox (or a moving paused one), best first.

Capacity and admission first: only active nodes that heartbeat recently and report room
for the sandbox's memory are candidates (the node's own admission stays the final word,
and the control plane tries the next candidate when a node refuses). Then locality: a
node that already holds what the sandbox starts from (the snapshot's files, the
template's disk stack in its block daemon, the paused sandbox's files) reads nothing from
the object store, while it is not nearly full (`LOCAL_LOAD_LIMIT`). Then spread: the
node with the most free committed memory, so load evens out; ties are broken by a hash
of the request's key, not always the same node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..state.nodes import NodeInfo

# A node holding the content is preferred while it is committed below this fraction of its
# memory; past it, it competes on free memory like any other (a popular template would
# otherwise fill its first nodes to the brim while others idle).
LOCAL_LOAD_LIMIT = 0.75


@dataclass(frozen=True)
class Wanted:
    """What a placement is for."""

    memory_mb: int
    # Spreads ties between equal nodes (a template id, a sandbox id).
    key: str = ""
    # Local content that makes a node the better choice: snapshot ids, layer ids.
    snapshots: frozenset[str] = field(default_factory=frozenset)
    layers: frozenset[str] = field(default_factory=frozenset)
    # A node that held the sandbox before (its files may still be there).
    origin: str | None = None


def candidates(nodes: list[NodeInfo], wanted: Wanted, now: float, timeout: float) -> list[NodeInfo]:
    """Nodes that may take `wanted`, best first."""
    fit = [
        n
        for n in nodes
        if n.state.places
        and n.silent_for(now) < timeout
        and n.capacity.free_memory_mb >= wanted.memory_mb
    ]
    return sorted(fit, key=lambda n: _rank(n, wanted))


def _rank(node: NodeInfo, wanted: Wanted) -> tuple[int, int, int]:
    capacity = node.capacity
    local = (
        node.name == wanted.origin
        or any(s in capacity.snapshot_set for s in wanted.snapshots)
        or any(layer in capacity.layer_set for layer in wanted.layers)
    ) and capacity.committed_memory_mb < LOCAL_LOAD_LIMIT * capacity.memory_mb
    # Any stable mix of key and node will do: it only orders equals.
    tie = hash((wanted.key, node.name))
    return (0 if local else 1, -capacity.free_memory_mb, tie)
