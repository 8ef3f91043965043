"""A thousand images, a small disk: hundreds of generated multi-layer images in the local
cluster's own registry, together at least 20 times a node's chunk-cache limit, started
across a 2-node cluster in a Zipf draw.

Each start goes through the control plane with the unmodified E2B SDK, naming the image
itself (`registry.pull_on_create`: its first start pulls and converts it), checks every
file of the image's own layers against the sums its top layer carries, and kills the
sandbox. Meanwhile each node's chunk cache is sampled: what its block daemon counts and
what its directory holds on disk.

Prints JSON lines: cold starts (an image's first: pull, convert, start) against warm ones
(p50/p99 and their ratio), each node's cache hit ratio, the most cache bytes seen against
the limit, and failures by kind. Run: `python -m benchmarks.bench_fleet_images
[--images 200] [--starts 400] [--workers 3] [--cache-mib 64]`.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from e2b import Sandbox

from agentenv.cluster.local import ClusterState, LocalCluster
from agentenv.config import load_config
from agentenv.storage.blockd import BlockdClient
from tests.images.oci_build import (
    LayerBuilder,
    build_image,
    build_layer,
    busybox_layer,
    push_image,
)

from .bench_pause import p50, p99

MIB = 2**20
ZIPF_S = 1.1
ENV = {
    "AENV_SANDBOX_MEMORY_MB": "256",
    "AENV_SERVER_CODE_INTERPRETER": "false",
    "AENV_SERVER_LOG_FORMAT": "text",
    "AENV_REGISTRY_PULL_ON_CREATE": "true",
}


def emit(doc: dict) -> None:
    print(json.dumps(doc), flush=True)


# -- images ------------------------------------------------------------------------------


def push_images(registry: str, count: int, data_mib: int) -> tuple[list[str], int]:
    """`count` images of three layers: the shared base, `data_mib` MiB of random files of
    its own, and a top layer naming it with the files' sums. Their refs, and the bytes of
    their own layers' files together."""
    base = busybox_layer()
    refs, own_bytes = [], 0
    files = 4
    for n in range(count):
        data, sums = LayerBuilder().dir("opt").dir("opt/data"), []
        for k in range(files):
            blob = os.urandom(data_mib * MIB // files)
            data = data.file(f"opt/data/part-{k}.bin", blob)
            sums.append(f"{hashlib.sha256(blob).hexdigest()}  /opt/data/part-{k}.bin\n")
            own_bytes += len(blob)
        top = (
            LayerBuilder()
            .dir("etc/fleet")
            .file("etc/fleet/id", f"{n}\n".encode())
            .file("etc/fleet/sums", "".join(sums).encode())
        )
        layers = [base, build_layer(data, "none"), build_layer(top, "gzip")]
        push_image(f"http://{registry}", f"fleet/app-{n:03d}", "v1", build_image(layers))
        refs.append(f"{registry}/fleet/app-{n:03d}:v1")
    return refs, own_bytes


# -- the chunk caches --------------------------------------------------------------------


@dataclass
class CacheWatch:
    """Each node's chunk cache, sampled on a thread until stopped."""

    nodes: dict[str, BlockdClient]
    dirs: dict[str, Path]
    counted_max: dict[str, int] = field(default_factory=dict)
    on_disk_max: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def of(cls, state: ClusterState) -> CacheWatch:
        nodes, dirs = {}, {}
        for member in state.members:
            if member.role == "node":
                prefix = state.network.node_prefix(member.index)
                cfg = load_config(env={"AENV_HOME": member.home, "AENV_NET_NAME_PREFIX": prefix})
                nodes[member.name], dirs[member.name] = BlockdClient(cfg), cfg.cache_dir
        return cls(nodes, dirs)

    def stats(self) -> dict[str, dict]:
        return {name: client.stats()["cache"] for name, client in self.nodes.items()}

    def run(self) -> None:
        while not self._stop.wait(0.2):
            for name, cache in self.stats().items():
                used = _disk_bytes(self.dirs[name])
                self.counted_max[name] = max(self.counted_max.get(name, 0), cache["bytes_used"])
                self.on_disk_max[name] = max(self.on_disk_max.get(name, 0), used)
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()


def _disk_bytes(directory: Path) -> int:
    """Bytes the files under `directory` take on disk (allocated blocks)."""
    total = 0
    for path in directory.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_blocks * 512
        except FileNotFoundError:
            continue  # evicted while we looked
    return total


# -- starts ------------------------------------------------------------------------------


@dataclass
class Start:
    image: int
    cold: bool
    seconds: float = 0.0
    error: str = ""


def start_one(ref: str, image: int) -> None:
    """Create from the image, check its files and its id, kill it."""
    sandbox = Sandbox.create(ref, timeout=300, request_timeout=600)
    try:
        out = sandbox.commands.run("sha256sum -c -s /etc/fleet/sums && cat /etc/fleet/id")
        if out.stdout.strip() != str(image):
            raise RuntimeError(f"image {image} answered {out.stdout.strip()!r}")
    finally:
        sandbox.kill()


def run_starts(refs: list[str], draws: list[int], workers: int) -> list[Start]:
    """Every draw started, `workers` at once; a start is cold when no start of its image
    had finished when it began."""
    done: set[int] = set()
    lock = threading.Lock()

    def one(image: int) -> Start:
        with lock:
            start = Start(image, cold=image not in done)
        began = time.perf_counter()
        try:
            start_one(refs[image], image)
        except Exception as exc:
            start.error = f"{type(exc).__name__}: {str(exc)[:120]}"
        start.seconds = time.perf_counter() - began
        with lock:
            done.add(image)
        return start

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, draws))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--starts", type=int, default=400)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--cache-mib", type=int, default=64)
    parser.add_argument("--data-mib", type=int, default=8, help="each image's own files")
    args = parser.parse_args()
    limit = args.cache_mib * MIB
    env = {**ENV, "AENV_CACHE_MAX_BYTES": str(limit)}
    with tempfile.TemporaryDirectory(prefix="aenv-bench-fleet-", dir="/tmp") as tmp:
        cluster = LocalCluster(Path(tmp), env=env)
        state = cluster.up(2, registry=True)
        try:
            began = time.perf_counter()
            refs, own_bytes = push_images(state.registry, args.images, args.data_mib)
            emit(
                {
                    "bench": "fleet_images_setup",
                    "images": len(refs),
                    "layers_per_image": 3,
                    "own_mib_per_image": args.data_mib,
                    "images_own_mib": round(own_bytes / MIB),
                    "cache_limit_mib": args.cache_mib,
                    "images_over_cache_limit": round(own_bytes / limit, 1),
                    "push_s": round(time.perf_counter() - began, 1),
                }
            )
            url = state.control.url
            os.environ.update(
                {"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": state.api_key}
            )
            draws = random.Random(11).choices(
                range(len(refs)), weights=[1 / (k + 1) ** ZIPF_S for k in range(len(refs))],
                k=args.starts,
            )  # fmt: skip
            watch = CacheWatch.of(state)
            before = watch.stats()
            sampler = threading.Thread(target=watch.run, daemon=True)
            sampler.start()
            began = time.perf_counter()
            starts = run_starts(refs, draws, args.workers)
            wall = time.perf_counter() - began
            watch.stop()
            sampler.join()
            after = watch.stats()
            report(starts, args.workers, wall, watch, before, after, limit)
        finally:
            cluster.down()


def report(
    starts: list[Start],
    workers: int,
    wall: float,
    watch: CacheWatch,
    before: dict[str, dict],
    after: dict[str, dict],
    limit: int,
) -> None:
    failures = collections.Counter(s.error for s in starts if s.error)
    cold = [s.seconds for s in starts if s.cold and not s.error]
    warm = [s.seconds for s in starts if not s.cold and not s.error]
    hit_ratio = {}
    for name in after:
        hits = after[name]["hits"] - before[name]["hits"]
        misses = after[name]["misses"] - before[name]["misses"]
        hit_ratio[name] = round(hits / max(1, hits + misses), 3)
    emit(
        {
            "bench": "fleet_images_starts",
            "starts": len(starts),
            "distinct_images": len({s.image for s in starts}),
            "workers": workers,
            "wall_s": round(wall, 1),
            "starts_per_s": round(len(starts) / wall, 3),
            "failures": dict(failures),
            "cold": len(cold),
            "cold_p50_s": p50(cold) if cold else None,
            "cold_p99_s": p99(cold) if cold else None,
            "warm": len(warm),
            "warm_p50_s": p50(warm) if warm else None,
            "warm_p99_s": p99(warm) if warm else None,
            "cold_over_warm": round(p50(cold) / p50(warm), 2) if cold and warm else None,
            "cache_hit_ratio": hit_ratio,
            "cache_fetched_mib": {
                n: round((after[n]["fetched_bytes"] - before[n]["fetched_bytes"]) / MIB)
                for n in after
            },
            "cache_evictions": {n: after[n]["evictions"] - before[n]["evictions"] for n in after},
            "cache_limit_mib": limit // MIB,
            "cache_max_counted_mib": {n: round(v / MIB, 1) for n, v in watch.counted_max.items()},
            "cache_max_on_disk_mib": {n: round(v / MIB, 1) for n, v in watch.on_disk_max.items()},
            "cache_within_limit": all(
                v <= limit for v in (*watch.counted_max.values(), *watch.on_disk_max.values())
            ),
            "cache_samples": watch.samples,
        }
    )


if __name__ == "__main__":
    main()
