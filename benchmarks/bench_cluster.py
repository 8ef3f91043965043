"""The control plane's cost, side by side in one run on a local cluster of two nodes:
proxied requests per second and creates per second through the control plane against
straight to a node; and a resume on the paused sandbox's own node against one that
moves it to the other node (its RAM served from the object store, its disk fetched).

Prints JSON lines. Run: `python -m benchmarks.bench_cluster [--requests N]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from agentenv.cluster.local import LocalCluster
from agentenv.wire import ENVD_PORT

ENV = {
    "AENV_SANDBOX_MEMORY_MB": "256",
    "AENV_CLUSTER_HEARTBEAT_INTERVAL": "1",
    "AENV_SERVER_CODE_INTERPRETER": "false",
}


def requests_per_second(url: str, sandbox_id: str, count: int, workers: int) -> float:
    """GET the agent's /health through `url`'s proxy, `workers` clients at once."""
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT)}

    def run(n: int) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
            for _ in range(n):
                client.get("/health").raise_for_status()

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, [count // workers] * workers))
    return (count // workers * workers) / (time.perf_counter() - start)


def creates_per_second(url: str, key: str, count: int, workers: int) -> float:
    headers = {"X-API-Key": key}

    def create(_: int) -> str:
        answer = httpx.post(url + "/v2/sandboxes", json={"templateID": "base"},
                            headers=headers, timeout=600)  # fmt: skip
        answer.raise_for_status()
        return answer.json()["sandboxID"]

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        ids = list(pool.map(create, range(count)))
    elapsed = time.perf_counter() - start
    for sandbox_id in ids:
        httpx.delete(f"{url}/sandboxes/{sandbox_id}", headers=headers, timeout=120)
    return count / elapsed


def resume_seconds(api: httpx.Client, sandbox_id: str) -> float:
    start = time.perf_counter()
    api.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 300}).raise_for_status()
    return time.perf_counter() - start


def pause_until_stored(api: httpx.Client, sandbox_id: str) -> None:
    api.post(f"/sandboxes/{sandbox_id}/pause").raise_for_status()
    while api.get(f"/sandboxes/{sandbox_id}").json().get("storage") != "stored":
        time.sleep(0.3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--creates", type=int, default=6)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="aenv-bench-cluster-", dir="/tmp") as tmp:
        cluster = LocalCluster(Path(tmp), env=ENV)
        state = cluster.up(2)
        try:
            control = state.control.url
            api = httpx.Client(base_url=control, headers={"X-API-Key": state.api_key}, timeout=600)
            sandbox = api.post("/v2/sandboxes", json={"templateID": "base"}).json()
            sid = sandbox["sandboxID"]
            node = api.get(f"/sandboxes/{sid}").json()["node"]
            node_url = next(m.url for m in state.members if m.name == node)
            rps: dict[str, list[float]] = {"control": [], "node": []}
            for _ in range(args.cycles):  # interleaved, so drift hits both alike
                for name, url in (("control", control), ("node", node_url)):
                    rps[name].append(requests_per_second(url, sid, args.requests, args.workers))
            through, straight = statistics.median(rps["control"]), statistics.median(rps["node"])
            print(json.dumps({
                "bench": "cluster_proxy",
                "workers": args.workers,
                "through_control_rps": round(through),
                "straight_to_node_rps": round(straight),
                "control_over_node": round(through / straight, 2),
            }), flush=True)  # fmt: skip
            creates = {
                "control": creates_per_second(control, state.api_key, args.creates, 2),
                "node": creates_per_second(node_url, state.api_key, args.creates, 2),
            }
            print(json.dumps({
                "bench": "cluster_creates",
                "through_control_per_s": round(creates["control"], 2),
                "straight_to_node_per_s": round(creates["node"], 2),
                "control_over_node": round(creates["control"] / creates["node"], 2),
            }), flush=True)  # fmt: skip
            origin, moved = [], []
            for _ in range(args.cycles):
                pause_until_stored(api, sid)
                origin.append(resume_seconds(api, sid))
                pause_until_stored(api, sid)
                here = api.get(f"/sandboxes/{sid}").json()["node"]
                api.post(f"/nodes/{here}/drain").raise_for_status()
                moved.append(resume_seconds(api, sid))
                api.post(f"/nodes/{here}/activate").raise_for_status()
            print(json.dumps({
                "bench": "cluster_resume",
                "on_origin_p50_s": round(statistics.median(origin), 2),
                "on_other_node_p50_s": round(statistics.median(moved), 2),
                "other_over_origin": round(statistics.median(moved) / statistics.median(origin), 2),
            }), flush=True)  # fmt: skip
            api.delete(f"/sandboxes/{sid}")
        finally:
            cluster.down()


if __name__ == "__main__":
    main()
