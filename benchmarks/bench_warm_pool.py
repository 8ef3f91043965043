"""Create → first command output with and without the warm pool: two servers side by side
(one with `sandbox.warm_pool`, one without), creates interleaved so both see the same
load; before each warm create the pool is full again.

Prints JSON lines. Run: `python -m benchmarks.bench_warm_pool [--runs N]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from tests.live import LiveServer

from .bench_create import create_then_kill
from .bench_pause import p50, p99
from .harness import live_server, wait_snapshot

POOL = 2


def _pool_full(server: LiveServer, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while server.resources().vmms < POOL:
        if time.monotonic() > deadline:
            raise RuntimeError("the warm pool did not fill")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with live_server() as cold, live_server({"AENV_SANDBOX_WARM_POOL": str(POOL)}) as warm:
        wait_snapshot(cold)
        wait_snapshot(warm)
        without, with_pool = [], []
        for _ in range(args.runs):
            without.append(create_then_kill(cold))
            _pool_full(warm)
            with_pool.append(create_then_kill(warm))
    print(
        json.dumps(
            {
                "bench": "warm_pool",
                "runs": args.runs,
                "create_to_first_output_p50_s": p50(without),
                "create_to_first_output_p99_s": p99(without),
                "warm_pool_p50_s": p50(with_pool),
                "warm_pool_p99_s": p99(with_pool),
                "warm_over_without": round(
                    statistics.median(with_pool) / statistics.median(without), 2
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
