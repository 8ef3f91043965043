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
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentenv.config import load_config
from agentenv.guest.kit import build_kit, load_kit
from agentenv.images.base import build_base_template
from agentenv.net.netns import TAP_NAME, create_detached_tap, destroy_network
from agentenv.runtime.bootsnap import DISK_BYTES, Shape, sandbox_vm
from agentenv.runtime.manager import guest_kernel_args
from agentenv.vmm.qemu import QemuDriver
from agentenv.vmm.qemuimg import create_qcow2
from tests.live import LiveServer
from tests.rawvm import RawVm

from .harness import create_to_first_output, live_server, wait_snapshot


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


_HEALTH_PROBE = """
import socket, sys, time
while True:
    try:
        with socket.create_connection((sys.argv[1], 49983), timeout=0.05) as conn:
            conn.sendall(b"GET /health HTTP/1.0\\r\\n\\r\\n")
            if b" 204 " in conn.recv(64):
                break
    except OSError:
        time.sleep(0.005)
print(time.monotonic())
"""


async def raw_restore(snapshot: Path, workdir: Path) -> float:
    """The QEMU driver alone restores the snapshot; a probe started beforehand inside the
    namespace times it until the agent answers (no API, overlay, NAT, /init or exec)."""
    cfg = load_config()
    kit = load_kit(cfg)
    assert kit is not None
    netns = f"aenvbench-{os.getpid()}"
    await create_detached_tap(netns)
    try:
        gateway = f"{cfg.net.guest_gateway}/{cfg.net.guest_prefix}"
        # Re-ask for the guest's MAC every 10 ms, so the probe sees the guest the moment
        # it answers (the default retry is a second).
        for argv in (
            ("ip", "-n", netns, "addr", "add", gateway, "dev", TAP_NAME),
            (
                "ip",
                "netns",
                "exec",
                netns,
                "sysctl",
                "-qw",
                f"net.ipv4.neigh.{TAP_NAME}.retrans_time_ms=10",
            ),
        ):
            await (await asyncio.create_subprocess_exec(*argv)).wait()
        probe = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", netns, sys.executable, "-c", _HEALTH_PROBE, cfg.net.guest_ip,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        disk = workdir / "disk.qcow2"
        await create_qcow2(disk, DISK_BYTES)
        name = f"aenv-bench-{os.getpid()}"
        kernel_args = guest_kernel_args(cfg)
        spec = sandbox_vm(kit, name, Shape(1, 256), disk, workdir, kernel_args, netns)
        driver = QemuDriver(cfg.vmm.qemu_binary, "tcg")
        start = time.monotonic()
        handle = await driver.restore(spec, snapshot)
        try:
            async with asyncio.timeout(60):
                out, _ = await probe.communicate()
        finally:
            await driver.stop(handle)
        return float(out) - start
    finally:
        await destroy_network(netns)


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
    with server.client() as api:
        for sandbox_id in ids:
            api.delete(f"/sandboxes/{sandbox_id}")
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
