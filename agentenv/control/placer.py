"""The placer: one placement decision at a time per control-plane replica, each seeing
every placement made before it.

A decision reads the nodes and the placement ledger (`state/placements.py`), and adds the
placements this replica made that the read cannot show yet (their ledger rows were
written after it). Decisions that were already waiting when a read was made reuse it
(for at most `VIEW_TTL` seconds): a burst of creates is decided from memory, one after
the other, with one database round trip for all of them; a create that comes alone
reads afresh.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

from ..errors import AtCapacity, Unavailable
from ..state.nodes import NodeInfo, NodeRegistry
from ..state.placements import PlacementLedger
from .placement import Reserved, Wanted, candidates, up

# Seconds a read of the nodes and the ledger serves the decisions waiting for it.
VIEW_TTL = 0.05


@dataclass
class _Placed:
    """A placement of this replica: counted here until a ledger read shows it."""

    node: str
    memory_mb: int
    vcpus: int
    # When its ledger row was written (monotonic); None while it is being written.
    written_at: float | None = None


@dataclass(frozen=True)
class _View:
    read_at: float  # monotonic, before the reads
    # The last decision that had arrived by then: later ones read afresh.
    arrivals: int
    nodes: list[NodeInfo]
    reserved: dict[str, Reserved]
    # The placements the read saw.
    seen: frozenset[str]


class Placer:
    """Placement decisions and their reservations, for one control-plane replica."""

    def __init__(
        self,
        nodes: NodeRegistry,
        ledger: PlacementLedger,
        node_timeout: float,
        *,
        accept_hollow: bool = False,
    ) -> None:
        self.nodes = nodes
        self.ledger = ledger
        self.node_timeout = node_timeout
        # Hollow nodes (tests, benchmarks) take sandboxes only when the config says so.
        self.accept_hollow = accept_hollow
        self._deciding = asyncio.Lock()
        self._view: _View | None = None
        self._mine: dict[str, _Placed] = {}
        self._arrivals = 0

    def serves(self, node: NodeInfo) -> bool:
        """Whether this control plane sends `node` work at all (a hollow node only when
        the config accepts hollow nodes)."""
        return self.accept_hollow or not node.capacity.hollow

    async def place(self, wanted: Wanted, exclude: str = "") -> tuple[list[NodeInfo], str]:
        """The candidates for `wanted`, best first (never `exclude`), and a placement
        reserved on the first; AtCapacity (429) when none has room, Unavailable (503)
        when no node is up."""
        self._arrivals += 1
        arrival = self._arrivals
        async with self._deciding:
            view = await self._current_view(arrival)
            reserved = dict(view.reserved)
            for placement, placed in self._mine.items():
                if placement not in view.seen:
                    _add(reserved, placed.node, placed.memory_mb, placed.vcpus)
            found = candidates(view.nodes, wanted, time.time(), self.node_timeout, reserved)
            found = [n for n in found if n.name != exclude]
            if not found:
                now = time.time()
                if not any(up(n, now, self.node_timeout) for n in view.nodes):
                    raise Unavailable("no node is up to place the sandbox on")
                raise AtCapacity("no node has room for the sandbox")
            placement = self._start(found[0], wanted)
        await self._write(placement)
        return found, placement

    async def reserve(self, node: NodeInfo, wanted: Wanted) -> str:
        """A placement on `node` outside a decision (the next candidate after a refusal)."""
        placement = self._start(node, wanted)
        await self._write(placement)
        return placement

    async def close(self, placement: str, taken: bool) -> None:
        """Its node answered: it took the sandbox (the placement counts until the node's
        heartbeat shows it), or not (it never counted)."""
        if taken:
            await self.ledger.settle(placement)
            return
        self._mine.pop(placement, None)
        await self.ledger.release(placement)

    def _start(self, node: NodeInfo, wanted: Wanted) -> str:
        placement = uuid.uuid4().hex
        self._mine[placement] = _Placed(node.name, wanted.memory_mb, wanted.vcpus)
        return placement

    async def _write(self, placement: str) -> None:
        placed = self._mine[placement]
        try:
            await self.ledger.reserve(placed.node, placed.memory_mb, placed.vcpus, placement)
        except BaseException:
            self._mine.pop(placement, None)
            raise
        placed.written_at = time.monotonic()

    async def _current_view(self, arrival: int) -> _View:
        now = time.monotonic()
        view = self._view
        if view is not None and arrival <= view.arrivals and now - view.read_at < VIEW_TTL:
            return view
        arrivals = self._arrivals
        nodes = [n for n in await self.nodes.list() if self.serves(n)]
        outstanding = await self.ledger.outstanding()
        reserved: dict[str, Reserved] = {}
        for row in outstanding:
            _add(reserved, row.node, row.memory_mb, row.vcpus)
        seen = frozenset(row.placement_id for row in outstanding)
        self._view = _View(now, arrivals, nodes, reserved, seen)
        # Placements written before this read are in it, or count no more (settled and
        # reflected, or released): either way no longer apart.
        for placement, placed in list(self._mine.items()):
            if placed.written_at is not None and placed.written_at < now:
                del self._mine[placement]
        return self._view


def _add(reserved: dict[str, Reserved], node: str, memory_mb: int, vcpus: int) -> None:
    held = reserved.get(node, Reserved())
    reserved[node] = Reserved(held.memory_mb + memory_mb, held.vcpus + vcpus)
