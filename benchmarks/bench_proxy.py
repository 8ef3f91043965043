"""The proxy's cost: the E2B SDK through the server vs. the same calls straight to the agent.

Prints JSON lines: `commands.run("true")` round trips, and upload/download throughput,
each through the proxy and direct, interleaved in one run, with their ratio.
Run: `python -m benchmarks.bench_proxy [--runs N] [--mib M]` from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import httpx
from e2b import Sandbox

from agentenv.config import load_config
from agentenv.net.netns import plan_network
from agentenv.state.sandboxes import SandboxRecord, SqlSandboxStore
from agentenv.wire import ACCESS_TOKEN_HEADER, ENVD_PORT, SANDBOX_ID_HEADER
from tests.live import TEST_KEY, LiveServer

from .harness import live_server


def agent_url(server: LiveServer, sandbox_id: str) -> str:
    """Where the proxy itself sends this sandbox's traffic."""

    async def find() -> SandboxRecord:
        store = await SqlSandboxStore.open(load_config(env=server.env).state_url, "bench")
        try:
            return next(r for r in await store.list_all() if r.sandbox_id == sandbox_id)
        finally:
            await store.close()

    record = asyncio.run(find())
    plan = plan_network(
        record.slot,
        sandbox_id,
        name_prefix=server.prefix,
        host_subnet=server.network[1],
        guest_ip="169.254.0.21",
        guest_gateway="169.254.0.22",
        guest_prefix=30,
    )
    return f"http://{plan.ns_ip}:{ENVD_PORT}"


def round_trips(sandbox: Sandbox, runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        sandbox.commands.run("true")
        samples.append(time.perf_counter() - start)
    return samples


def transfer(base_url: str, headers: dict[str, str], size: int) -> tuple[float, float]:
    """Upload then download `size` bytes; returns MiB/s for each direction."""
    chunk = os.urandom(2**20)

    def body():
        for _ in range(size // len(chunk)):
            yield chunk

    octet = {**headers, "Content-Type": "application/octet-stream"}
    with httpx.Client(base_url=base_url, headers=octet, timeout=600) as client:
        start = time.perf_counter()
        client.post("/files", params={"path": "/tmp/bench.bin"}, content=body()).raise_for_status()
        up = size / 2**20 / (time.perf_counter() - start)
        start = time.perf_counter()
        received = 0
        with client.stream("GET", "/files", params={"path": "/tmp/bench.bin"}) as response:
            for part in response.iter_raw():
                received += len(part)
        assert received == size
        down = size / 2**20 / (time.perf_counter() - start)
    return up, down


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--mib", type=int, default=64)
    args = parser.parse_args()
    with live_server() as server:
        opts = {"api_url": server.url, "api_key": TEST_KEY}
        via_proxy = Sandbox.create(sandbox_url=server.url, **opts)
        direct_url = agent_url(server, via_proxy.sandbox_id)
        direct = Sandbox.connect(via_proxy.sandbox_id, sandbox_url=direct_url, **opts)
        proxied_s, direct_s = [], []
        round_trips(via_proxy, 3)  # warm both paths' connections
        round_trips(direct, 3)
        for _ in range(args.runs // 5):
            proxied_s += round_trips(via_proxy, 5)
            direct_s += round_trips(direct, 5)
        p50_proxy, p50_direct = statistics.median(proxied_s), statistics.median(direct_s)
        print(json.dumps({
            "bench": "commands_run_true",
            "runs": len(proxied_s),
            "proxy_p50_ms": round(p50_proxy * 1000, 1),
            "direct_p50_ms": round(p50_direct * 1000, 1),
            "proxy_over_direct": round(p50_proxy / p50_direct, 2),
        }))  # fmt: skip
        size = args.mib * 2**20
        # Sandboxes made by the v2 create are secured: /files wants their envd token.
        token = {ACCESS_TOKEN_HEADER: via_proxy._envd_access_token or ""}
        routed = {SANDBOX_ID_HEADER: via_proxy.sandbox_id, **token}
        up_p, down_p = transfer(server.url, routed, size)
        up_d, down_d = transfer(direct_url, token, size)
        print(json.dumps({
            "bench": "files_throughput",
            "mib": args.mib,
            "upload_proxy_mib_s": round(up_p, 1),
            "upload_direct_mib_s": round(up_d, 1),
            "download_proxy_mib_s": round(down_p, 1),
            "download_direct_mib_s": round(down_d, 1),
            "upload_proxy_over_direct": round(up_p / up_d, 2),
            "download_proxy_over_direct": round(down_p / down_d, 2),
        }))  # fmt: skip
        via_proxy.kill()


if __name__ == "__main__":
    main()
