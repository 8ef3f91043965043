"""Images: lazy vs eager create, block daemon read throughput, chunk cache hit ratio.

Prints JSON lines. `lazy`: a new node with an empty chunk cache starts a sandbox from a
~1 GB image another node already converted into a shared store, side by side with `eager`
(a new node pulls and converts it, then creates). Both restore the sandbox from the
node's boot snapshot, which a node builds once at start, whatever images it will serve.
`fuse`: reads through the block daemon's FUSE file vs the same stack materialized to a
raw file: cold, first re-read and steady warm. `zipf`: a small chunk cache under
Zipf-distributed sandbox starts over many images, next to LRU, Belady (OPT) and
unbounded-cache floors.
Run: `python -m benchmarks.bench_images [--part lazy|fuse|zipf]` from the repository root.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from agentenv.config import load_config
from agentenv.images.base import build_base_template
from agentenv.images.convert import load_layer, loop_mount, materialize
from agentenv.images.templates import TemplateRegistry
from agentenv.storage.blockd import BlockdClient
from agentenv.storage.blockd.daemon import chunks_in_order
from agentenv.storage.chunkcache import ChunkCache
from agentenv.storage.layer import BLOCK_SIZE, CHUNK_TARGET, LayerWriter, Stack, chunk_key
from agentenv.storage.posix import PosixObjectStore
from tests.images.oci_build import LayerBuilder, build_image, build_layer, push_image
from tests.images.registry_server import running_registry
from tests.live import TEST_KEY, LiveServer

from .harness import create_to_first_output, live_server, wait_snapshot

TEMPLATE = "big"
MIB = 2**20


def emit(doc: dict) -> None:
    print(json.dumps(doc), flush=True)


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


# -- the ~1 GB image ---------------------------------------------------------------------


@dataclass
class BigImage:
    """The image pushed to a local registry and converted once into a shared store."""

    ref: str
    shared_root: Path
    layers: list[str]
    chunk_bytes: int
    chunks: int
    data_blocks: list[int]
    size: int


def build_and_push(registry_url: str, data_mb: int, files: int, workdir: Path) -> int:
    """The Debian base tree layer plus `data_mb` MiB of random bytes in `files` files."""
    base = build_base_template(load_config(), progress=lambda _: None)
    with loop_mount(base.rootfs, workdir / "base-mnt", readonly=True) as root:
        debian = build_layer(LayerBuilder.from_dir(root, owner=None), "zstd")
    per_file = data_mb * MIB // files
    data = LayerBuilder().dir("data")
    for n in range(files):
        data.file(f"data/blob-{n:04d}.bin", os.urandom(per_file))
    bulk = build_layer(data, "none")
    del data
    image = build_image([debian, bulk])
    push_image(registry_url, "bench/big", "v1", image)
    return len(debian.tar) + len(bulk.tar)


def pull(server: LiveServer, ref: str) -> None:
    """`POST /templates/pull` until the template line arrives (the pull is done)."""
    headers = {"X-API-Key": TEST_KEY}
    with httpx.Client(base_url=server.url, headers=headers, timeout=1800) as api:
        with api.stream("POST", "/templates/pull", json={"image": ref, "name": TEMPLATE}) as r:
            for line in r.iter_lines():
                doc = json.loads(line) if line.strip() else {}
                if "error" in doc:
                    raise RuntimeError(f"pull failed: {doc['error']}")
                if "template" in doc:
                    return
    raise RuntimeError("pull stream ended without a template")


@contextmanager
def big_image(data_mb: int, files: int, tmp: Path) -> Iterator[BigImage]:
    """Build, push, and convert the image once into a shared store (the "other node")."""
    with running_registry(tmp / "registry") as registry:
        t0 = time.perf_counter()
        tar_bytes = build_and_push(registry.url, data_mb, files, tmp)
        t1 = time.perf_counter()
        ref = f"{registry.host}/bench/big:v1"
        shared = tmp / "shared-objects"
        with live_server({"AENV_STORAGE_POSIX_ROOT": str(shared)}) as seeder:
            pull(seeder, ref)
        t2 = time.perf_counter()
        store = PosixObjectStore(shared)
        record = TemplateRegistry(store).get(TEMPLATE)
        stack = Stack([load_layer(store, layer_id) for layer_id in record.layers])
        chunk_bytes = sum(store.size(chunk_key(d)) for d in stack.chunks())
        blocks = [b for b in range(stack.size // BLOCK_SIZE) if stack.lookup(b) is not None]
        emit(
            {
                "bench": "image_setup",
                "layer_tar_mib": round(tar_bytes / MIB, 1),
                "block_layers": len(record.layers),
                "disk_size_mib": stack.size // MIB,
                "chunks": len(stack.chunks()),
                "chunk_mib": round(chunk_bytes / MIB, 1),
                "build_push_s": round(t1 - t0, 1),
                "first_pull_s": round(t2 - t1, 1),
            }
        )
        yield BigImage(
            ref, shared, record.layers, chunk_bytes, len(stack.chunks()), blocks, stack.size
        )


# -- part 1: lazy vs eager ---------------------------------------------------------------


def lazy_run(image: BigImage) -> dict:
    """A new node on the shared store: empty chunk cache, its own block daemon."""
    with live_server({"AENV_STORAGE_POSIX_ROOT": str(image.shared_root)}) as server:
        wait_snapshot(server)
        elapsed = create_to_first_output(server, TEMPLATE)[0]
        stats = BlockdClient(load_config(env=server.env)).stats()
    cache = stats["cache"]
    fetched, misses = cache["fetched_bytes"], cache["misses"]
    return {"s": elapsed, "fetched": fetched, "misses": misses, **stats["fs"]}


def eager_run(image: BigImage) -> dict:
    """A new node with its own empty store: download + convert, then create."""
    with live_server() as server:
        wait_snapshot(server)
        start = time.perf_counter()
        pull(server, image.ref)
        pulled = time.perf_counter() - start
        created = create_to_first_output(server, TEMPLATE)[0]
    return {"s": pulled + created, "pull_s": pulled, "create_s": created}


def part_lazy(image: BigImage, runs: int) -> None:
    lazy: list[dict] = []
    eager: list[dict] = []
    for n in range(runs):
        # Alternate which goes first, so neither always runs on a warmer host.
        order = (lazy_run, eager_run) if n % 2 == 0 else (eager_run, lazy_run)
        for fn in order:
            result = fn(image)
            (lazy if fn is lazy_run else eager).append(result)
            log(f"run {n + 1}: {fn.__name__} {result['s']:.1f}s")
    lazy_s = statistics.median(r["s"] for r in lazy)
    eager_s = statistics.median(r["s"] for r in eager)
    fetched = statistics.median(r["fetched"] for r in lazy)
    guest = statistics.median(r["read_bytes"] for r in lazy)
    # Chunks the boot asked for and had to wait on; the rest came from the background
    # prefetch the server queues at mount.
    demand = statistics.median(r["misses"] for r in lazy) * image.chunk_bytes / image.chunks
    emit(
        {
            "bench": "lazy_vs_eager_create",
            "runs": runs,
            "lazy_s": round(lazy_s, 2),
            "lazy_samples_s": [round(r["s"], 2) for r in lazy],
            "eager_s": round(eager_s, 2),
            "eager_samples_s": [round(r["s"], 2) for r in eager],
            "eager_pull_s": round(statistics.median(r["pull_s"] for r in eager), 2),
            "eager_create_s": round(statistics.median(r["create_s"] for r in eager), 2),
            "lazy_over_eager": round(lazy_s / eager_s, 3),
            "fetched_mib": round(fetched / MIB, 1),
            "image_chunk_mib": round(image.chunk_bytes / MIB, 1),
            "fetched_fraction": round(fetched / image.chunk_bytes, 3),
            "demand_fetched_mib": round(demand / MIB, 1),
            "guest_read_mib": round(guest / MIB, 1),
            "guest_read_fraction": round(guest / image.chunk_bytes, 3),
        }
    )


# -- part 2: block daemon vs raw file ----------------------------------------------------


def drop_caches() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def read_sequential(path: Path, size: int) -> float:
    """Seconds to read the whole file in 1 MiB reads."""
    buf = bytearray(MIB)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()
        done = 0
        while done < size:
            n = os.readv(fd, [view])
            if n == 0:
                break
            done += n
        return time.perf_counter() - start
    finally:
        os.close(fd)


def read_random(path: Path, offsets: list[int]) -> float:
    """Seconds for one 4 KiB `pread` at each offset."""
    fd = os.open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()
        for offset in offsets:
            os.pread(fd, 4096, offset)
        return time.perf_counter() - start
    finally:
        os.close(fd)


@contextmanager
def fresh_daemon(image: BigImage, tmp: Path) -> Iterator[tuple[Path, BlockdClient]]:
    """A block daemon with its own home (empty chunk cache) serving the shared stack."""
    home = Path(tempfile.mkdtemp(prefix="blockd-", dir=tmp))
    env = {**os.environ, "AENV_HOME": str(home), "AENV_STORAGE_POSIX_ROOT": str(image.shared_root)}
    client = BlockdClient(load_config(env=env))
    try:
        client.ensure_running()
        path, _ = client.mount(TEMPLATE, image.layers)
        yield path, client
    finally:
        client.stop()


def _rates(kind: str, secs: float, image: BigImage, count: int) -> dict:
    if kind == "seq":
        return {"mb_s": round(image.size / 1e6 / secs, 1)}
    return {"iops": round(count / secs)}


WARM_PASSES = 3


def part_fuse(image: BigImage, tmp: Path, random_reads: int) -> None:
    """Cold, first re-read and steady warm passes, raw and daemon interleaved."""
    raw = tmp / "raw.img"
    store = PosixObjectStore(image.shared_root)
    materialize(Stack([load_layer(store, i) for i in image.layers]), store, raw)
    rng = random.Random(1234)
    offsets = [
        rng.choice(image.data_blocks) * BLOCK_SIZE + rng.randrange(BLOCK_SIZE // 4096) * 4096
        for _ in range(random_reads)
    ]
    unit = {"seq": "mb_s", "rand": "iops"}
    results: dict[str, float] = {}
    ratios: dict[str, float] = {}

    def measure(kind: str, path: Path) -> float:
        secs = read_sequential(path, image.size) if kind == "seq" else read_random(path, offsets)
        return _rates(kind, secs, image, random_reads)[unit[kind]]

    for kind in ("seq", "rand"):
        with fresh_daemon(image, tmp) as (path, client):
            drop_caches()
            paths = {"raw": raw, "fuse": path}
            for name, target in paths.items():
                results[f"{name}_{kind}_cold"] = measure(kind, target)
            # Warm: both files in the page cache, passes alternated so drift hits both.
            passes: dict[str, list[float]] = {"raw": [], "fuse": []}
            for _ in range(WARM_PASSES):
                for name, target in paths.items():
                    passes[name].append(measure(kind, target))
            for name in paths:
                results[f"{name}_{kind}_rewarm_first"] = passes[name][0]
                results[f"{name}_{kind}_warm"] = statistics.median(passes[name])
            # Chunks now in the daemon's cache, page cache dropped: the daemon's own path.
            drop_caches()
            results[f"fuse_{kind}_chunkcache"] = measure(kind, path)
            stats = client.stats()
        log(f"{kind}: {results} cache={stats['cache']}")
        for state in ("cold", "rewarm_first", "warm"):
            ours, floor = results[f"fuse_{kind}_{state}"], results[f"raw_{kind}_{state}"]
            ratios[f"{kind}_{state}_fuse_over_raw"] = round(ours / floor, 3)
        ours, floor = results[f"fuse_{kind}_chunkcache"], results[f"raw_{kind}_cold"]
        ratios[f"{kind}_chunkcache_over_raw_cold"] = round(ours / floor, 3)
    raw.unlink()
    emit(
        {
            "bench": "blockd_read_throughput",
            "image_mib": image.size // MIB,
            "data_mib": round(len(image.data_blocks) * BLOCK_SIZE / MIB, 1),
            "random_reads": random_reads,
            "warm_passes": WARM_PASSES,
            **results,
            **ratios,
        }
    )


# -- part 3: Zipf workload over a small cache --------------------------------------------


def write_images(store: PosixObjectStore, count: int, chunks: int) -> list[list[str]]:
    """`count` one-layer stacks of `chunks` random chunks each; each one's chunks in order."""
    per_chunk = CHUNK_TARGET // BLOCK_SIZE
    out = []
    for n in range(count):
        writer = LayerWriter(store, f"zipf-{n:03d}", None, chunks * CHUNK_TARGET)
        for block in range(chunks * per_chunk):
            writer.add_block(block, os.urandom(BLOCK_SIZE))
        out.append(chunks_in_order(Stack([writer.finish()])))
    return out


def zipf_trace(images: int, starts: int, s: float, seed: int) -> list[int]:
    weights = [1 / (k + 1) ** s for k in range(images)]
    return random.Random(seed).choices(range(images), weights=weights, k=starts)


def simulate_lru(accesses: list[str], capacity: int) -> int:
    """Hits of a plain LRU holding `capacity` chunks."""
    held: OrderedDict[str, None] = OrderedDict()
    hits = 0
    for digest in accesses:
        if digest in held:
            hits += 1
            held.move_to_end(digest)
            continue
        held[digest] = None
        if len(held) > capacity:
            held.popitem(last=False)
    return hits


def simulate_opt(accesses: list[str], capacity: int) -> int:
    """Hits of Belady's offline optimum (evict the chunk used furthest in the future)."""
    upcoming: dict[str, list[int]] = {}
    for i in range(len(accesses) - 1, -1, -1):
        upcoming.setdefault(accesses[i], []).append(i)
    held: set[str] = set()
    hits = 0
    for digest in accesses:
        upcoming[digest].pop()
        if digest in held:
            hits += 1
            continue
        if len(held) >= capacity:
            victim = max(held, key=lambda d: upcoming[d][-1] if upcoming[d] else math.inf)
            held.remove(victim)
        held.add(digest)
    return hits


def part_zipf(tmp: Path, images: int, chunks: int, starts: int, hot: float) -> None:
    store = PosixObjectStore(tmp / "zipf-store")
    t0 = time.perf_counter()
    stacks = write_images(store, images, chunks)
    total = images * chunks * CHUNK_TARGET
    log(f"zipf: wrote {images} images, {total / MIB:.0f} MiB in {time.perf_counter() - t0:.1f}s")
    trace = zipf_trace(images, starts, 1.1, seed=7)
    hot_n = max(1, math.ceil(hot * chunks))
    accesses = [digest for image in trace for digest in stacks[image][:hot_n]]
    for fraction in (0.1, 0.3):
        cap = int(total * fraction)
        with ChunkCache(tmp / f"zipf-cache-{fraction}", store, cap) as cache:
            start = time.perf_counter()
            for digest in accesses:
                cache.read(digest, 0, CHUNK_TARGET)
            elapsed = time.perf_counter() - start
            stats = cache.stats()
        reads = stats.hits + stats.misses
        # Floors on the same trace: plain LRU and OPT sized to the cap (in whole chunks),
        # and an unbounded cache (only first-touch misses).
        slots = cap // CHUNK_TARGET
        emit(
            {
                "bench": "chunk_cache_zipf",
                "images": images,
                "image_mib": chunks * CHUNK_TARGET // MIB,
                "starts": starts,
                "zipf_s": 1.1,
                "hot_fraction": hot,
                "cap_fraction": fraction,
                "cap_mib": cap // MIB,
                "chunk_reads": reads,
                "hit_ratio": round(stats.hits / reads, 3),
                "lru_at_cap_hit_ratio": round(simulate_lru(accesses, slots) / reads, 3),
                "opt_at_cap_hit_ratio": round(simulate_opt(accesses, slots) / reads, 3),
                "unbounded_hit_ratio": round(1 - len(set(accesses)) / reads, 3),
                "fetched_mib": round(stats.fetched_bytes / MIB, 1),
                "evictions": stats.evictions,
                "bytes_used_mib": round(stats.bytes_used / MIB, 1),
                "elapsed_s": round(elapsed, 1),
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["lazy", "fuse", "zipf"], action="append")
    parser.add_argument("--runs", type=int, default=3, help="lazy/eager pairs")
    parser.add_argument("--data-mb", type=int, default=800, help="random data in the image")
    parser.add_argument("--files", type=int, default=320, help="files the data is split into")
    parser.add_argument("--random-reads", type=int, default=20000)
    parser.add_argument("--zipf-images", type=int, default=20)
    parser.add_argument("--zipf-chunks", type=int, default=16, help="4 MiB chunks per image")
    parser.add_argument("--zipf-starts", type=int, default=1000)
    parser.add_argument("--zipf-hot", type=float, default=0.3)
    args = parser.parse_args()
    parts = args.part or ["lazy", "fuse", "zipf"]
    with tempfile.TemporaryDirectory(prefix="aenv-bench-images-", dir="/var/tmp") as tmpdir:
        tmp = Path(tmpdir)
        if "lazy" in parts or "fuse" in parts:
            with big_image(args.data_mb, args.files, tmp) as image:
                if "lazy" in parts:
                    t0 = time.perf_counter()
                    part_lazy(image, args.runs)
                    log(f"lazy part: {time.perf_counter() - t0:.0f}s")
                if "fuse" in parts:
                    t0 = time.perf_counter()
                    part_fuse(image, tmp, args.random_reads)
                    log(f"fuse part: {time.perf_counter() - t0:.0f}s")
        if "zipf" in parts:
            t0 = time.perf_counter()
            part_zipf(tmp, args.zipf_images, args.zipf_chunks, args.zipf_starts, args.zipf_hot)
            log(f"zipf part: {time.perf_counter() - t0:.0f}s")


if __name__ == "__main__":
    main()
