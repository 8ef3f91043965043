"""Pause and resume through the API, next to the QEMU driver alone doing the same.

Prints JSON lines. Ours: `POST /sandboxes/{id}/pause` until it answers, and
`POST /sandboxes/{id}/connect` until `echo ready` run through the proxy prints. Floors
(`rawguest.RawGuest`): the driver saving device state and stopping QEMU, and the driver
restoring from those files until the agent answers `/health`. Also the resident memory of
the sandbox's VMM process running and while paused, and forks of it (1, then 4) until
they all run.
Run: `python -m benchmarks.bench_pause [--cycles N]` from the repository root.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from tests.live import LiveServer

from .harness import (
    create_to_first_output,
    echo_ready,
    kill_all,
    live_server,
    vmm_rss_mib,
    wait_snapshot,
)
from .rawguest import RawGuest


def api_cycle(server: LiveServer, sandbox_id: str) -> tuple[float, float, float, float]:
    """(pause seconds, resume seconds until connect answers — the agent has answered
    `/health` and `/init` by then —, until `echo ready` prints, VMM MiB while paused)."""
    with server.client() as api:
        start = time.perf_counter()
        response = api.post(f"/sandboxes/{sandbox_id}/pause", json={})
        paused = time.perf_counter() - start
        assert response.status_code == 204, response.text
        rss_paused = vmm_rss_mib(server, sandbox_id)
        start = time.perf_counter()
        response = api.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 300})
        answered = time.perf_counter() - start
        assert response.status_code == 201, response.text
    echo_ready(server, sandbox_id, response.json()["envdAccessToken"])
    return paused, answered, time.perf_counter() - start, rss_paused


def fork_children(server: LiveServer, sandbox_id: str, count: int) -> list[str]:
    """`POST /fork` for `count` forks; returns once all of them run, with their ids."""
    with server.client() as api:
        response = api.post(f"/sandboxes/{sandbox_id}/fork", json={"count": count}, timeout=600)
    assert response.status_code == 201, response.text
    children = [r["sandbox"]["sandboxID"] for r in response.json() if "sandbox" in r]
    assert len(children) == count, response.text
    return children


def fork_seconds(server: LiveServer, sandbox_id: str, count: int) -> float:
    """Seconds until `count` forks all run; they are killed after."""
    start = time.perf_counter()
    children = fork_children(server, sandbox_id, count)
    elapsed = time.perf_counter() - start
    kill_all(server, children)
    return elapsed


async def raw_cycles(snapshot: Path, cycles: int) -> tuple[list[float], list[float]]:
    pauses, resumes = [], []
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        async with RawGuest(Path(tmp)) as guest:
            await guest.restore(snapshot)
            for _ in range(cycles):
                pauses.append(await guest.pause())
                resumes.append(await guest.restore(guest.snapshot_dir))
    return pauses, resumes


def p50(samples: list[float]) -> float:
    return round(statistics.median(samples), 3)


def p99(samples: list[float]) -> float:
    """The 99th percentile (with a handful of samples: the slowest)."""
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    with live_server() as server:
        snapshot = wait_snapshot(server)
        _, sandbox_id = create_to_first_output(server)
        rss = vmm_rss_mib(server, sandbox_id)
        pauses, answers, resumes, paused_rss = [], [], [], []
        for _ in range(args.cycles):
            paused, answered, resumed, rss_paused = api_cycle(server, sandbox_id)
            pauses.append(paused)
            answers.append(answered)
            resumes.append(resumed)
            paused_rss.append(rss_paused)
        forks = {n: fork_seconds(server, sandbox_id, n) for n in (1, 4)}
        raw_pauses, raw_resumes = asyncio.run(raw_cycles(snapshot, args.cycles))
    doc = {
        "bench": "pause_resume",
        "cycles": args.cycles,
        "pause_p50_s": p50(pauses),
        "pause_p99_s": p99(pauses),
        "raw_pause_p50_s": p50(raw_pauses),
        "resume_to_agent_answering_p50_s": p50(answers),
        "resume_to_first_output_p50_s": p50(resumes),
        "resume_to_first_output_p99_s": p99(resumes),
        "raw_resume_to_agent_health_p50_s": p50(raw_resumes),
        "pause_over_raw": round(statistics.median(pauses) / statistics.median(raw_pauses), 2),
        "resume_answering_over_raw": round(
            statistics.median(answers) / statistics.median(raw_resumes), 2
        ),
        "resume_over_raw": round(statistics.median(resumes) / statistics.median(raw_resumes), 2),
        "vmm_rss_mib_running": round(rss, 1),
        "vmm_rss_mib_paused_max": round(max(paused_rss), 1),
    }
    print(json.dumps(doc))
    print(json.dumps({"bench": "fork", **{f"fork_{n}_s": round(t, 2) for n, t in forks.items()}}))


if __name__ == "__main__":
    main()
