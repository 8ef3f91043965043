"""Placement: which nodes may take a new sandbox (or a moving paused one), best first.

Capacity and admission first: only active nodes that heartbeat recently and report room
for the sandbox's memory are candidates (the node's own admission stays the final word,
and the control plane tries the next candidate when a node refuses). Then locality: a
node that already holds what the sandbox starts from (the snapshot's files, the
template's disk stack in its block daemon, the paused sandbox's files) reads nothing from
the object store. Then spread: the node with the most free committed memory, so load
evens out; ties are broken by a hash of the sandbox key, not always the same node.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .nodes import ACTIVE, NodeInfo


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
        if n.state == ACTIVE
        and n.silent_for(now) < timeout
        and n.capacity.free_memory_mb >= wanted.memory_mb
    ]
    return sorted(fit, key=lambda n: _rank(n, wanted))


def _rank(node: NodeInfo, wanted: Wanted) -> tuple[int, int, str]:
    cached = bool(wanted.snapshots & set(node.capacity.snapshots)) or bool(
        wanted.layers & set(node.capacity.layers)
    )
    local = node.name == wanted.origin or cached
    tie = hashlib.sha256(f"{wanted.key}/{node.name}".encode()).hexdigest()
    return (0 if local else 1, -node.capacity.free_memory_mb, tie)
