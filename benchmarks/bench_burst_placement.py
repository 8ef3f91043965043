"""A burst of creates through the real control plane (`control/plane.py`) over simulated
nodes: how evenly it lands, with the placement ledger and with heartbeats alone (what
placement saw before the ledger), side by side in one run.

Each simulated node answers a create after a draw from `--create-ms` (uniform) and
heartbeats every `--heartbeat` seconds with what it took; the state store is SQLite.
Prints one JSON line per mode: sandboxes per node, max/mean (goal ≤ 1.3 with the ledger),
and the control plane's own time per create (placement decision and ledger writes: all
of a create's time less the simulated node's).

Run: `python -m benchmarks.bench_burst_placement [--nodes 10] [--creates 100]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from agentenv.api.idempotency import IDEMPOTENCY_KEY
from agentenv.config import Config
from agentenv.control.placement import Wanted, candidates
from agentenv.control.placer import Placer
from agentenv.control.plane import ControlPlane
from agentenv.state.nodes import NodeCapacity, NodeInfo
from agentenv.state.sandboxes import open_engine

NODE_MEMORY_MB = 64 * 1024
CORES = 16


class HeartbeatsOnly(Placer):
    """Placement as it was before the ledger: what nodes last reported, nothing since."""

    async def place(self, wanted: Wanted, exclude: str = "") -> tuple[list[NodeInfo], str]:
        nodes = candidates(await self.nodes.list(), wanted, time.time(), self.node_timeout)
        return nodes, ""

    async def reserve(self, node: NodeInfo, wanted: Wanted) -> str:
        return ""

    async def close(self, placement: str, taken: bool) -> None:
        pass


async def burst(args: argparse.Namespace, ledger: bool, home: Path) -> dict[str, object]:
    cfg = Config()
    cfg.paths.home = str(home)
    rng = random.Random(args.seed)
    taken: collections.Counter[str] = collections.Counter()
    # Per create (by its idempotency key): the simulated node's seconds, and the total's.
    node_seconds: dict[str, float] = {}
    overhead_ms: list[float] = []
    low, high = args.create_ms

    async def node_answers(request: httpx.Request) -> httpx.Response:
        start = time.perf_counter()
        await asyncio.sleep(rng.uniform(low, high) / 1000)
        node_seconds[request.headers[IDEMPOTENCY_KEY]] = time.perf_counter() - start
        taken[request.url.host] += 1
        return httpx.Response(201, json={})

    engine = await open_engine(f"sqlite:///{home / 'state.db'}")
    names = [f"n{i:03}" for i in range(args.nodes)]
    async with httpx.AsyncClient(transport=httpx.MockTransport(node_answers)) as client:
        plane = ControlPlane(cfg, engine, client)
        if not ledger:
            plane.placer = HeartbeatsOnly(plane.nodes, plane.placements, 15.0)

        def capacity(name: str) -> NodeCapacity:
            used = taken[name] * cfg.sandbox.memory_mb
            return NodeCapacity(
                memory_mb=NODE_MEMORY_MB,
                committed_memory_mb=used,
                cores=CORES,
                committed_vcpus=taken[name] * cfg.sandbox.vcpus,
            )

        for name in names:
            await plane.nodes.register(name, f"http://{name}", capacity(name))

        async def heartbeats() -> None:
            while True:
                await asyncio.sleep(args.heartbeat)
                for name in names:
                    await plane.nodes.heartbeat(name, capacity(name))

        async def create() -> None:
            key = uuid.uuid4().hex
            start = time.perf_counter()
            await plane.create("/v2/sandboxes", b'{"templateID": "base"}', {IDEMPOTENCY_KEY: key})
            overhead_ms.append(1000 * (time.perf_counter() - start - node_seconds[key]))

        beating = asyncio.create_task(heartbeats())
        started = time.perf_counter()
        await asyncio.gather(*(create() for _ in range(args.creates)))
        wall = time.perf_counter() - started
        beating.cancel()
    await engine.dispose()
    counts = [taken[name] for name in names]
    mean = statistics.mean(counts)
    return {
        "bench": "burst_placement",
        "mode": "ledger" if ledger else "heartbeats_only",
        "nodes": args.nodes,
        "creates": args.creates,
        "per_node_min": min(counts),
        "per_node_max": max(counts),
        "max_over_mean": round(max(counts) / mean, 2),
        "nodes_used": sum(1 for c in counts if c),
        # A create's time at the control plane, less the simulated node's.
        "overhead_p50_ms": round(statistics.median(overhead_ms), 1),
        "overhead_p99_ms": round(statistics.quantiles(overhead_ms, n=100)[98], 1),
        "burst_seconds": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--creates", type=int, default=100)
    parser.add_argument("--heartbeat", type=float, default=2.0)
    parser.add_argument("--create-ms", type=float, nargs=2, default=(300.0, 1500.0))
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for ledger in (True, False):
        with tempfile.TemporaryDirectory(prefix="aenv-burst-") as home:
            print(json.dumps(asyncio.run(burst(args, ledger, Path(home)))), flush=True)


if __name__ == "__main__":
    main()
