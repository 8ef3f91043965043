"""The code interpreter through the official SDKs, next to plain commands, in one run.

Prints JSON lines:
- create → first `run_code("1+1")` result (`e2b_code_interpreter`, template
  `code-interpreter-v1`, restored with its kernel already started) next to create → first
  `commands.run("echo ready")` output (`e2b`, template `base`); goal: at most 1.3 times;
- a `run_code("1+1")` round trip next to a `commands.run("true")` round trip on the same
  warm code-interpreter sandbox; goal: at most 1.5 times;
- the host memory idle code-interpreter sandboxes hold (their VMMs' PSS, with and without
  TCG's translation buffer) after one cell and an idle period.
Run: `python -m benchmarks.bench_code_interpreter [--runs N] [--count K] [--idle SECONDS]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable

from e2b import Sandbox as CommandSandbox
from e2b_code_interpreter import Sandbox as InterpreterSandbox

from tests.live import TEST_KEY, LiveServer, vmm_pid

from .bench_density import vmm_memory_mb
from .harness import live_server

TEMPLATE = "code-interpreter-v1"
TEMPLATE_MEMORY_MB = 1024


def _p50(samples: list[float]) -> float:
    return round(statistics.median(samples), 4)


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def wait_template(server: LiveServer, timeout: float = 1800) -> None:
    """Until the node has built the code-interpreter template (it does when it starts)."""
    claim = server.home / "objects" / "builtin" / f"{TEMPLATE}.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = json.loads(claim.read_text())["state"] if claim.exists() else "absent"
        if state == "ready":
            return
        if state == "failed":
            raise RuntimeError(f"{TEMPLATE} failed to build: {claim.read_text()}")
        time.sleep(2)
    raise RuntimeError(f"{TEMPLATE} was not built within {timeout:.0f}s")


def create_to_first_result() -> float:
    start = time.perf_counter()
    sandbox = InterpreterSandbox.create()
    try:
        if sandbox.run_code("1+1").text != "2":
            raise RuntimeError("run_code('1+1') did not answer 2")
        return time.perf_counter() - start
    finally:
        sandbox.kill()


def create_to_first_command() -> float:
    start = time.perf_counter()
    sandbox = CommandSandbox.create()
    try:
        if sandbox.commands.run("echo ready").stdout != "ready\n":
            raise RuntimeError("`echo ready` printed something else")
        return time.perf_counter() - start
    finally:
        sandbox.kill()


def round_trips(runs: int) -> dict:
    sandbox = InterpreterSandbox.create()
    try:
        sandbox.run_code("1+1")
        sandbox.commands.run("true")
        code = [_timed(lambda: sandbox.run_code("1+1")) for _ in range(runs)]
        command = [_timed(lambda: sandbox.commands.run("true")) for _ in range(runs)]
    finally:
        sandbox.kill()
    return {
        "bench": "code_interpreter_round_trip",
        "runs": runs,
        "run_code_p50_s": _p50(code),
        "command_p50_s": _p50(command),
        "ratio": round(statistics.median(code) / statistics.median(command), 2),
        "goal": 1.5,
    }


def idle_memory(server: LiveServer, count: int, idle_s: float) -> dict:
    sandboxes = [InterpreterSandbox.create() for _ in range(count)]
    try:
        for sandbox in sandboxes:
            sandbox.run_code(
                "import pandas as pd\ndf = pd.DataFrame({'x': range(1000)})\ndf.x.sum()"
            )
        time.sleep(idle_s)
        pss = [vmm_memory_mb(pid) for s in sandboxes if (pid := vmm_pid(server, s.sandbox_id))]
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
    totals = [total for total, _ in pss]
    without_buffer = [total - buffer for total, buffer in pss]
    return {
        "bench": "code_interpreter_idle_memory",
        "sandboxes": count,
        "idle_s": idle_s,
        "guest_memory_mb": TEMPLATE_MEMORY_MB,
        "pss_mib_per_sandbox": round(statistics.mean(totals), 1),
        "pss_without_tcg_buffer_mib_per_sandbox": round(statistics.mean(without_buffer), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--idle", type=float, default=60.0)
    args = parser.parse_args()
    with live_server({"AENV_SERVER_CODE_INTERPRETER": "true"}) as server:
        os.environ.update(
            {"E2B_API_URL": server.url, "E2B_SANDBOX_URL": server.url, "E2B_API_KEY": TEST_KEY}
        )
        wait_template(server)
        create_to_first_result()  # the first restore maps the template's files in
        # Interleaved, so drift on a noisy machine falls on both sides alike.
        code, command = [], []
        for _ in range(args.runs):
            code.append(create_to_first_result())
            command.append(create_to_first_command())
        print(
            json.dumps(
                {
                    "bench": "code_interpreter_create_to_first_result",
                    "runs": args.runs,
                    "run_code_p50_s": _p50(code),
                    "command_p50_s": _p50(command),
                    "ratio": round(statistics.median(code) / statistics.median(command), 2),
                    "goal": 1.3,
                }
            ),
            flush=True,
        )
        print(json.dumps(round_trips(args.runs * 4)), flush=True)
        print(json.dumps(idle_memory(server, args.count, args.idle)), flush=True)


if __name__ == "__main__":
    main()
