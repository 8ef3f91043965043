"""The execution service on the host (real kernels, no VM): start -> /health 200 (the
default python kernel started and warm), and the SDK's ``run_code`` round trip next to its
floor, the same cell sent straight to a kernel with jupyter_client.

Prints JSON lines. Run: `python -m benchmarks.bench_interpreter_service [--runs N]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from jupyter_client.manager import start_new_kernel

from tests.guest.interp_service import fake_agent, running_service

CELLS = (("1 + 1", "1 + 1"), ("print", "print('x')"))


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(samples: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(samples), 2), "p90": round(percentile(samples, 0.9), 2)}


def kernel_floor(runs: int) -> None:
    """A cell's round trip through jupyter_client alone, to a kernel started the same way."""
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        for name, cell in CELLS:
            samples = []
            for _ in range(runs):
                start = time.perf_counter()
                client.execute_interactive(cell, output_hook=lambda _msg: None, timeout=30)
                samples.append((time.perf_counter() - start) * 1000)
            print(json.dumps({"metric": "kernel_floor_ms", "cell": name, **summary(samples)}))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200, help="run_code calls per cell")
    parser.add_argument("--starts", type=int, default=3, help="service starts to time")
    args = parser.parse_args()
    with fake_agent() as agent, tempfile.TemporaryDirectory() as tmp:
        starts = []
        for n in range(args.starts):
            with running_service(Path(tmp) / f"start{n}", agent) as service:
                starts.append(service.ready_at - service.started_at)
        print(json.dumps({"metric": "start_to_health_s", "runs": starts}))
        with running_service(Path(tmp) / "runs", agent) as service:
            sbx = service.sandbox()
            sbx.run_code("1 + 1")  # the sandbox's env vars are read on the first cell
            for name, cell in CELLS:
                samples = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    sbx.run_code(cell)
                    samples.append((time.perf_counter() - start) * 1000)
                print(json.dumps({"metric": "run_code_ms", "cell": name, **summary(samples)}))
        kernel_floor(args.runs)


if __name__ == "__main__":
    main()
