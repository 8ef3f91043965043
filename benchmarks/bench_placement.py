"""Placement at fleet scale, simulated: 1,000 nodes, 1.5 M images drawn Zipf, a replay of
creates and resumes placed by our policy (`control/placement.py`, the real function)
against round robin and random (the reference's two policies).

Each node has room for `--slots` sandboxes and an LRU image cache of `--cache-gb`. A
create of an image the chosen node does not cache fetches the image from the object
store (and caches it); a resume of a paused sandbox on a node other than the one holding
its files fetches its saved state. Every policy skips full nodes. Sandboxes live a fixed
number of events; half of those that end are paused and may be resumed later.

Prints one JSON line per policy. Run: `python -m benchmarks.bench_placement [--events N]`.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import random
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from agentenv.control.placement import Wanted, candidates
from agentenv.state.nodes import NodeCapacity, NodeInfo

SANDBOX_MB = 512
GB = 10**9


@dataclass
class SimNode:
    """A node's cache and load, mirrored into the NodeInfo placement reads."""

    info: NodeInfo
    cache_bytes: int
    cached: OrderedDict[str, int] = field(default_factory=OrderedDict)
    used_bytes: int = 0
    running: int = 0

    def holds(self, image: str) -> bool:
        if image in self.cached:
            self.cached.move_to_end(image)
            return True
        return False

    def store(self, image: str, size: int) -> None:
        self.cached[image] = size
        self.used_bytes += size
        self.info.capacity.layer_set.add(image)
        while self.used_bytes > self.cache_bytes and len(self.cached) > 1:
            old, old_size = self.cached.popitem(last=False)
            self.used_bytes -= old_size
            self.info.capacity.layer_set.discard(old)

    def occupy(self, delta: int) -> None:
        self.running += delta
        self.info.capacity.committed_memory_mb = self.running * SANDBOX_MB


class Zipf:
    """Image ranks drawn with probability proportional to 1 / rank**s."""

    def __init__(self, count: int, s: float, rng: random.Random) -> None:
        weights = (1 / (rank**s) for rank in range(1, count + 1))
        self.cumulative = list(itertools.accumulate(weights))
        self.rng = rng

    def draw(self) -> int:
        return bisect.bisect_left(self.cumulative, self.rng.random() * self.cumulative[-1])


def image_size(rank: int) -> int:
    """A stable size per image: log-normal around 300 MB."""
    return int(random.Random(rank).lognormvariate(19.5, 0.9))


def simulate(policy: str, args: argparse.Namespace) -> dict[str, float | int | str]:
    rng = random.Random(args.seed)
    zipf = Zipf(args.images, args.zipf, random.Random(args.seed + 1))
    nodes = []
    for i in range(args.nodes):
        capacity = NodeCapacity(memory_mb=args.slots * SANDBOX_MB)
        info = NodeInfo(f"n{i}", "", "active", capacity, 0.0, 0.0)
        nodes.append(SimNode(info, args.cache_gb * GB))
    by_name = {n.info.name: n for n in nodes}
    infos = [n.info for n in nodes]
    ending: deque[tuple[int, SimNode, int]] = deque()  # (event it ends, node, image)
    paused: list[tuple[str, int]] = []  # (node holding its files, image)
    rr = itertools.cycle(range(args.nodes))
    stats = {"creates": 0, "hits": 0, "image_bytes": 0, "resumes": 0, "resumes_local": 0,
             "state_bytes": 0, "refused": 0}  # fmt: skip

    def place(wanted: Wanted) -> SimNode | None:
        if policy == "ours":
            best = candidates(infos, wanted, 1.0, 10.0)
            return by_name[best[0].name] if best else None
        for _ in range(args.nodes):
            node = nodes[next(rr)] if policy == "round_robin" else rng.choice(nodes)
            if node.running < args.slots:
                return node
        return None

    started = time.perf_counter()
    for event in range(args.events):
        while ending and ending[0][0] <= event:
            _, node, image = ending.popleft()
            node.occupy(-1)
            if rng.random() < args.pause_ratio:
                paused.append((node.info.name, image))
        resume = paused and rng.random() < args.resume_ratio
        if resume:
            origin, image = paused.pop(rng.randrange(len(paused)))
            wanted = Wanted(SANDBOX_MB, key=str(event), origin=origin)
        else:
            image = zipf.draw()
            wanted = Wanted(SANDBOX_MB, key=str(event), layers=frozenset({str(image)}))
        node = place(wanted)
        if node is None:
            stats["refused"] += 1
            continue
        if resume:
            stats["resumes"] += 1
            if node.info.name == origin:
                stats["resumes_local"] += 1
            else:
                stats["state_bytes"] += args.state_mb * 2**20
        else:
            stats["creates"] += 1
            if node.holds(str(image)):
                stats["hits"] += 1
            else:
                size = image_size(image)
                stats["image_bytes"] += size
                node.store(str(image), size)
        node.occupy(1)
        ending.append((event + args.lifetime, node, image))
    loads = [n.running for n in nodes]
    return {
        "bench": "placement_sim",
        "policy": policy,
        "nodes": args.nodes,
        "images": args.images,
        "events": args.events,
        "cache_hit_ratio": round(stats["hits"] / max(stats["creates"], 1), 3),
        "image_tb_fetched": round(stats["image_bytes"] / 10**12, 2),
        "resume_on_origin_ratio": round(stats["resumes_local"] / max(stats["resumes"], 1), 3),
        "state_tb_fetched": round(stats["state_bytes"] / 10**12, 2),
        "refused": stats["refused"],
        "max_node_load": max(loads),
        "mean_node_load": round(sum(loads) / len(loads), 1),
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--images", type=int, default=1_500_000)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--slots", type=int, default=32, help="sandboxes per node")
    parser.add_argument("--lifetime", type=int, default=20_000, help="events a sandbox lives")
    parser.add_argument("--cache-gb", type=int, default=50)
    parser.add_argument("--state-mb", type=int, default=256, help="a paused sandbox's files")
    parser.add_argument("--pause-ratio", type=float, default=0.5)
    parser.add_argument("--resume-ratio", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    for policy in ("ours", "round_robin", "random"):
        print(json.dumps(simulate(policy, args)), flush=True)


if __name__ == "__main__":
    main()
