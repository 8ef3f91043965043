"""Cold create → first command output through the API, side by side with a raw QEMU boot.

Prints JSON lines. The raw floor boots the same kernel, initramfs and disks with plain
QEMU and user-mode networking, and waits for the agent's /health: what is left of our
figure above it is the cost of the API, namespaces, taps and bookkeeping.
Also prints the resident memory of idle sandboxes' VMM processes.
Run: `python -m benchmarks.bench_create [--runs N]` from the repository root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from agentenv.config import load_config
from agentenv.guest.kit import build_kit
from agentenv.images.base import build_base_template
from tests.live import LiveServer
from tests.rawvm import RawVm

from .harness import create_to_first_output, live_server


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


def idle_rss(server: LiveServer, count: int, settle_s: float) -> dict:
    with server.client() as api:
        ids = [
            api.post("/v2/sandboxes", json={"templateID": "base"}).json()["sandboxID"]
            for _ in range(count)
        ]
    time.sleep(settle_s)
    rss_kib = []
    for sandbox_id in ids:
        workdir = str(server.home / "sandboxes" / sandbox_id).encode()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if workdir in (proc / "cmdline").read_bytes():
                        status = (proc / "status").read_text()
                        rss_kib.append(int(status.split("VmRSS:")[1].split()[0]))
                except (OSError, IndexError):
                    pass
    with server.client() as api:
        for sandbox_id in ids:
            api.delete(f"/sandboxes/{sandbox_id}")
    return {
        "bench": "idle_sandbox_vmm_rss",
        "sandboxes": count,
        "settle_s": settle_s,
        "guest_memory_mb": 256,
        "rss_mib_p50": round(statistics.median(rss_kib) / 1024, 1),
        "rss_mib_max": round(max(rss_kib) / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=int, default=3)
    args = parser.parse_args()
    with live_server() as server:
        ours, raw = [], []
        # Interleaved, so both paths see the same background load.
        for _ in range(args.runs):
            ours.append(create_then_kill(server))
            raw.append(raw_boot_to_health(server.home))
        print(json.dumps(_summary("create_to_first_output", ours)))
        print(json.dumps(_summary("raw_qemu_boot_to_agent_health", raw)))
        ratio = statistics.median(ours) / statistics.median(raw)
        print(json.dumps({"bench": "create_vs_raw_ratio", "p50_ratio": round(ratio, 2)}))
        print(json.dumps(idle_rss(server, args.idle, settle_s=10)))


if __name__ == "__main__":
    main()
