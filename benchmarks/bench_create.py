"""Create → first command output through the API, restored and booted, next to raw floors.

Prints JSON lines. Two servers: one restoring sandboxes from the boot snapshot (the
default), one booting them (`AENV_SANDBOX_BOOT_SNAPSHOTS=false`). Floors: plain QEMU
booting the same kernel, initramfs and disks with user-mode networking until the agent's
/health, and the QEMU driver alone restoring the same snapshot until the agent's /health.
What is left above a floor is the API, namespaces, taps, disk overlay, /init and exec.
Also prints a burst of concurrent creates (wall time until all run) and the resident
memory of idle sandboxes' VMM processes.
Run: `python -m benchmarks.bench_create [--runs N]` from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentenv.config import load_config
from agentenv.guest.kit import build_kit
from agentenv.images.base import build_base_template
from tests.live import LiveServer
from tests.rawvm import RawVm

from .harness import (
    create_to_first_output,
    kill_all,
    live_server,
    vmm_rss_mib,
    wait_snapshot,
)
from .rawguest import RawGuest


def _summary(name: str, samples: list[float], **extra: object) -> dict:
    return {
        "bench": name,
        "runs": len(samples),
        "p50_s": round(statistics.median(samples), 3),
        "min_s": round(min(samples), 3),
        "max_s": round(max(samples), 3),
        **extra,
    }


def create_then_kill(server: LiveServer) -> float:
    elapsed, sandbox_id = create_to_first_output(server)
    with server.client() as api:
        api.delete(f"/sandboxes/{sandbox_id}")
    return elapsed


def raw_boot_to_health(workdir: Path) -> float:
    """Plain QEMU with the same kit and disks; no API, namespace or tap."""
    cfg = load_config()
    kit = build_kit(cfg, progress=lambda _: None)
    base = build_base_template(cfg, progress=lambda _: None)
    start = time.perf_counter()
    vm = RawVm(kit, base.rootfs, Path(tempfile.mkdtemp(dir=workdir)), memory_mb=256)
    try:
        if not vm.wait_health(time.monotonic() + 120):
            raise RuntimeError("raw boot did not answer within 120s")
        return time.perf_counter() - start
    finally:
        vm.stop()


async def raw_restore(snapshot: Path, workdir: Path) -> float:
    async with RawGuest(workdir) as guest:
        return await guest.restore(snapshot)


def burst(server: LiveServer, count: int) -> dict:
    """`count` creates at once (as many API clients): wall time until all are running."""

    def create(_: int) -> str:
        with server.client() as api:
            response = api.post("/v2/sandboxes", json={"templateID": "base"}, timeout=600)
        if response.status_code != 201:
            raise RuntimeError(f"create failed: {response.status_code} {response.text[:300]}")
        return response.json()["sandboxID"]

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        ids = list(pool.map(create, range(count)))
    elapsed = time.perf_counter() - start
    kill_all(server, ids)
    return {
        "bench": "create_burst_restored",
        "sandboxes": count,
        "wall_s": round(elapsed, 2),
        "creates_per_s": round(count / elapsed, 2),
    }


def idle_rss(server: LiveServer, count: int, settle_s: float) -> dict:
    with server.client() as api:
        ids = [
            api.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
            for _ in range(count)
        ]
    time.sleep(settle_s)
    rss = [vmm_rss_mib(server, sandbox_id) for sandbox_id in ids]
    kill_all(server, ids)
    return {
        "bench": "idle_sandbox_vmm_rss",
        "sandboxes": count,
        "settle_s": settle_s,
        "guest_memory_mb": 256,
        "rss_mib_p50": round(statistics.median(rss), 1),
        "rss_mib_max": round(max(rss), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold-runs", type=int, default=3)
    parser.add_argument("--idle", type=int, default=3)
    parser.add_argument("--burst", type=int, default=16)
    args = parser.parse_args()
    with live_server() as server:
        snapshot = wait_snapshot(server, 256)
        restored, floor = [], []
        # Interleaved, so both paths see the same background load.
        for _ in range(args.runs):
            restored.append(create_then_kill(server))
            with tempfile.TemporaryDirectory(dir=server.home) as tmp:
                floor.append(asyncio.run(raw_restore(snapshot, Path(tmp))))
        print(json.dumps(_summary("create_to_first_output_restored", restored)))
        print(json.dumps(_summary("raw_qemu_restore_to_agent_health", floor)))
        idle = idle_rss(server, args.idle, settle_s=10)
        print(json.dumps(burst(server, args.burst)))
    with live_server({"AENV_SANDBOX_BOOT_SNAPSHOTS": "false"}) as server:
        booted, raw = [], []
        for _ in range(args.cold_runs):
            booted.append(create_then_kill(server))
            raw.append(raw_boot_to_health(server.home))
        print(json.dumps(_summary("create_to_first_output_booted", booted)))
        print(json.dumps(_summary("raw_qemu_boot_to_agent_health", raw)))
    p50 = statistics.median
    ratios = {
        "restored_over_raw_restore": round(p50(restored) / p50(floor), 2),
        "booted_over_raw_boot": round(p50(booted) / p50(raw), 2),
        "restored_over_booted": round(p50(restored) / p50(booted), 3),
    }
    print(json.dumps({"bench": "create_ratios", **ratios}))
    print(json.dumps(idle))


if __name__ == "__main__":
    main()
