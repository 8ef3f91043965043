"""The node's API while guests spin every core, with guests niced (`vmm.guest_nice`) and
not, side by side in one run.

For each niceness, a server of its own: `GET /v2/sandboxes` and `GET /sandboxes/{id}`
are timed with no guest busy, then again while `--spinners` guests each run a busy loop
(more than the cores). Prints a JSON line per niceness: p50/p99 of both, idle and
loaded, and loaded over idle.
Run: `python -m benchmarks.bench_noisy_guests [--spinners 4] [--samples 40]`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from e2b import Sandbox

from tests.live import LiveServer

from .bench_pause import p50, p99
from .harness import live_server

NICENESS = (0, 5)
# Seconds the busy loops get to fill the cores before the loaded samples.
SETTLE_S = 3.0


def sampled(server: LiveServer, sandbox_id: str, samples: int) -> dict[str, list[float]]:
    """Seconds per call of each route, one call of each every 0.1 s."""
    taken: dict[str, list[float]] = {"list": [], "get": []}
    with server.client() as api:
        for _ in range(samples):
            for name, route in (("list", "/v2/sandboxes"), ("get", f"/sandboxes/{sandbox_id}")):
                start = time.perf_counter()
                answer = api.get(route)
                taken[name].append(time.perf_counter() - start)
                answer.raise_for_status()
            time.sleep(0.1)
    return taken


def measure(nice: int, spinners: int, samples: int) -> dict:
    with live_server({"AENV_VMM_GUEST_NICE": str(nice)}) as server:
        os.environ.update(
            {
                "E2B_API_URL": server.url,
                "E2B_SANDBOX_URL": server.url,
                "E2B_API_KEY": server.api_key,
            }
        )
        sandboxes = [Sandbox.create() for _ in range(spinners)]
        try:
            idle = sampled(server, sandboxes[0].sandbox_id, samples)
            for sandbox in sandboxes:
                sandbox.commands.run("while :; do :; done", background=True)
            time.sleep(SETTLE_S)
            loaded = sampled(server, sandboxes[0].sandbox_id, samples)
        finally:
            for sandbox in sandboxes:
                sandbox.kill()
    result: dict = {"bench": "noisy_guests", "guest_nice": nice, "spinners": spinners}
    for name in ("list", "get"):
        result |= {
            f"{name}_idle_p50_s": p50(idle[name]),
            f"{name}_idle_p99_s": p99(idle[name]),
            f"{name}_loaded_p50_s": p50(loaded[name]),
            f"{name}_loaded_p99_s": p99(loaded[name]),
            f"{name}_loaded_over_idle_p50": round(p50(loaded[name]) / p50(idle[name]), 2),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spinners", type=int, default=4)
    parser.add_argument("--samples", type=int, default=40)
    args = parser.parse_args()
    for nice in NICENESS:
        print(json.dumps(measure(nice, args.spinners, args.samples)), flush=True)


if __name__ == "__main__":
    main()
