"""Snapshots through the API: taking one after 0 / 10 / 100 MB of fresh writes to memory
and disk (time, and bytes its upload wrote to the object store), creating from a snapshot
with its files on the node (warm) and on a new node that has only the object store
(cold: its RAM served page by page, the rest fetched), next to
creating from the template; rollback; forks of 1, 8 and 32; 20 paused sandboxes resumed at
once; host memory of 8 sandboxes made from one snapshot against 8 times one.

Prints JSON lines. Run: `python -m benchmarks.bench_snapshots [--cycles N]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.live import LiveServer, vmm_pid

from .bench_pause import fork_children, fork_seconds, p50, p99
from .harness import create_to_first_output, echo_ready, kill_all, live_server, wait_snapshot


def _run(server: LiveServer, sandbox: dict[str, Any], cmd: str) -> None:
    from tests.e2e.test_sandbox_lifecycle import run

    _, _, code = run(server, sandbox, cmd)
    assert code == 0, cmd


def _store_bytes(server: LiveServer) -> int:
    root = server.home / "objects"
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _snapshot(server: LiveServer, sandbox_id: str) -> tuple[str, float]:
    with server.client() as api:
        start = time.perf_counter()
        answer = api.post(f"/sandboxes/{sandbox_id}/snapshots", json={}, timeout=600)
        elapsed = time.perf_counter() - start
    assert answer.status_code == 201, answer.text
    return answer.json()["snapshotID"], elapsed


def _until_stored(server: LiveServer, snapshot_id: str) -> None:
    deadline = time.monotonic() + 600
    with server.client() as api:
        while api.get("/snapshots", params={"name": snapshot_id}).json()[0]["status"] != "stored":
            assert time.monotonic() < deadline, "upload never finished"
            time.sleep(0.2)


def dirty_snapshots(server: LiveServer, sandbox: dict[str, Any]) -> list[dict[str, Any]]:
    """For each size: a base snapshot (stored), then that many MB written to tmpfs (RAM)
    and to a disk file, then a second snapshot: its time and the bytes its upload wrote."""
    sid = sandbox["sandboxID"]
    rows = []
    for mb in (0, 10, 100):
        _run(server, sandbox, "rm -f /dev/shm/m* ~/d*")
        base, _ = _snapshot(server, sid)
        _until_stored(server, base)
        if mb:
            _run(server, sandbox, f"head -c {mb}M /dev/urandom > /dev/shm/m{mb}")
            _run(server, sandbox, f"head -c {mb}M /dev/urandom > ~/d{mb} && sync")
        before = _store_bytes(server)
        snapshot, seconds = _snapshot(server, sid)
        _until_stored(server, snapshot)
        written = _store_bytes(server) - before
        rows.append(
            {
                "dirty_mb_memory_and_disk": mb,
                "snapshot_s": round(seconds, 3),
                "upload_written_mb": round(written / 2**20, 1),
                "written_over_dirty": round(written / (2 * mb * 2**20), 2) if mb else None,
            }
        )
    return rows


def create_from(server: LiveServer, template: str) -> float:
    seconds, sandbox_id = create_to_first_output(server, template)
    kill_all(server, [sandbox_id])
    return seconds


def cold_create_from(server: LiveServer, snapshot: str) -> float:
    """Create from `snapshot` on a new node (empty home: no local files, no chunk cache,
    no page cache of its block daemon) sharing `server`'s object store."""
    with tempfile.TemporaryDirectory(prefix="aenv-bench-node-") as tmp:
        node = LiveServer(
            Path(tmp), extra_env={"AENV_STORAGE_POSIX_ROOT": str(server.home / "objects")}
        )
        try:
            node.start()
            wait_snapshot(node)
            return create_from(node, snapshot)
        finally:
            node.close()


def vmm_pss_mib(server: LiveServer, sandbox_id: str) -> float:
    """Proportional set size of the sandbox's VMM: shared pages count once in a sum."""
    pid = vmm_pid(server, sandbox_id)
    assert pid is not None
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(rollup.split("Pss:")[1].split()[0]) / 1024


def clones_memory(server: LiveServer, snapshot: str, count: int) -> dict[str, float]:
    """Host memory (VMMs' PSS summed) of 1 and of `count` sandboxes from one snapshot,
    each after running a command, and what `count` would be at `count` x one."""
    one = create_to_first_output(server, snapshot)[1]
    time.sleep(2)
    single = vmm_pss_mib(server, one)
    clones = [create_to_first_output(server, snapshot)[1] for _ in range(count - 1)]
    time.sleep(2)
    total = sum(vmm_pss_mib(server, sid) for sid in [one, *clones])
    kill_all(server, [one, *clones])
    return {
        "one_clone_pss_mib": round(single, 1),
        f"clones_{count}_pss_mib": round(total, 1),
        f"clones_{count}_over_{count}x_one": round(total / (count * single), 2),
    }


def concurrent_resumes(server: LiveServer, sandbox_id: str, count: int) -> dict[str, float]:
    """Fork `count` sandboxes and pause them all, then resume them at once: the wall time
    until every connect answered, and each connect's own time."""
    children = fork_children(server, sandbox_id, count)
    with server.client() as api:
        for child in children:
            assert api.post(f"/sandboxes/{child}/pause", json={}).status_code == 204

    def resume(child: str) -> float:
        with server.client() as api:
            start = time.perf_counter()
            answer = api.post(f"/sandboxes/{child}/connect", json={"timeout": 300}, timeout=600)
            assert answer.status_code == 201, answer.text
            return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(count) as pool:
        each = list(pool.map(resume, children))
    wall = time.perf_counter() - start
    kill_all(server, children)
    return {
        f"resumes_{count}_wall_s": round(wall, 2),
        "resume_p50_s": p50(each),
        "resume_p99_s": p99(each),
    }


def rollback_seconds(server: LiveServer, sandbox: dict[str, Any], snapshot: str) -> float:
    with server.client() as api:
        start = time.perf_counter()
        answer = api.post(
            f"/sandboxes/{sandbox['sandboxID']}/rollback", json={"snapshotID": snapshot}
        )
        assert answer.status_code == 200, answer.text
    echo_ready(server, sandbox["sandboxID"], sandbox.get("envdAccessToken"))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    with live_server() as server:
        wait_snapshot(server)
        with server.client() as api:
            sandbox = api.post("/v2/sandboxes", json={"templateID": "base"}).json()
        for row in dirty_snapshots(server, sandbox):
            print(json.dumps({"bench": "snapshot_dirty", **row}))

        snapshot, _ = _snapshot(server, sandbox["sandboxID"])
        _until_stored(server, snapshot)
        template = [create_from(server, "base") for _ in range(args.cycles)]
        warm = [create_from(server, snapshot) for _ in range(args.cycles)]
        cold = [cold_create_from(server, snapshot) for _ in range(args.cycles)]
        rollbacks = [rollback_seconds(server, sandbox, snapshot) for _ in range(args.cycles)]
        forks = {n: fork_seconds(server, sandbox["sandboxID"], n) for n in (1, 8, 32)}
        resumes = concurrent_resumes(server, sandbox["sandboxID"], 20)
        memory = clones_memory(server, snapshot, 8)
        kill_all(server, [sandbox["sandboxID"]])
    print(
        json.dumps(
            {
                "bench": "create_from_snapshot",
                "cycles": args.cycles,
                "template_to_first_output_p50_s": p50(template),
                "snapshot_warm_p50_s": p50(warm),
                "snapshot_cold_p50_s": p50(cold),
                "cold_over_warm": round(statistics.median(cold) / statistics.median(warm), 2),
            }
        )
    )
    print(json.dumps({"bench": "rollback", "rollback_to_first_output_p50_s": p50(rollbacks)}))
    print(json.dumps({"bench": "fork", **{f"fork_{n}_s": round(t, 2) for n, t in forks.items()}}))
    print(json.dumps({"bench": "concurrent_resumes", **resumes}))
    print(json.dumps({"bench": "clones_memory", **memory}))


if __name__ == "__main__":
    main()
