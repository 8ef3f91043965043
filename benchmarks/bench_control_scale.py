"""The control plane at fleet scale, on a local cluster: PostgreSQL, S3, a control plane,
real nodes and hundreds of hollow nodes (`agentenv/cluster/hollow.py`: the node's code
over machines that start no guest), tens of thousands of sandboxes.

Side by side in one run:
- create through the control plane against straight to a node, on a real node (before
  the hollow nodes come) and on a hollow one (where the create itself costs little, so
  the control plane's own share shows);
- populating: creates per second through the control plane;
- a steady open-loop load of create, get, list-page and kill at each of `--rates`:
  p50/p99 per route (from each request's scheduled start), errors, the control plane's
  CPU seconds and state-store statements per request, PostgreSQL transactions per second;
- `--lose` hollow nodes killed at once: the time until they are declared lost, and every
  sandbox's state right afterwards (listed, lost, or answering);
- listing every sandbox page by page (p50/p99 per page).

Prints JSON lines. Run: `python -m benchmarks.bench_control_scale [--hollow 200]
[--sandboxes 20000] [--rates 50,100,200] [--seconds 30]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from agentenv.cluster.local import ClusterState, LocalCluster
from agentenv.state.sandboxes import engine_url

from .cpu import cpu_seconds

# Every server of the cluster. Real nodes promise little memory (3% of the host), so only
# two real VMs run on each (even idle, a guest under TCG takes CPU of its own); hollow
# nodes get room for their share of the sandboxes.
ENV = {
    "AENV_CLUSTER_ACCEPT_HOLLOW_NODES": "true",
    "AENV_SANDBOX_MEMORY_MB": "256",
    "AENV_SANDBOX_MEMORY_OVERCOMMIT": "0.03",
    "AENV_SERVER_CODE_INTERPRETER": "false",
    "AENV_SERVER_LOG_FORMAT": "text",
    # Hundreds of nodes share this machine's two cores here (each has its own in a real
    # cluster): a node's heartbeat may wait its turn for longer than the default 15 s.
    "AENV_CLUSTER_NODE_TIMEOUT": "60",
}
HOLLOW_ENV = {
    "AENV_SANDBOX_MEMORY_OVERCOMMIT": "8",
    "AENV_SANDBOX_DISK_OVERCOMMIT": "100",
    # 200 nodes of 3 connections each stay below PostgreSQL's 1000 with the rest.
    "AENV_STATE_MAX_CONNECTIONS": "3",
}
# Long enough that no sandbox of the run times out.
TIMEOUT = 3600
# Kinds of request in the steady load, by weight.
MIX = {"get": 4, "list_page": 3, "create": 1.5, "kill": 1.5}
PAGE = 100
# Hollow nodes per process (each process is one core's worth of Python), and their
# scheduling priority.
PER_PROCESS = 50
FLEET_NICENESS = 10


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "p50_ms": round(1000 * ordered[len(ordered) // 2], 1),
        "p99_ms": round(1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
        "n": len(ordered),
    }


def statements(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("aenv_state_statements_total "):
            return float(line.split()[1])
    raise RuntimeError("the control plane reports no state-store statements")


async def pg_transactions(state_url: str) -> int:
    engine = create_async_engine(engine_url(state_url))
    try:
        async with engine.connect() as connection:
            query = "select sum(xact_commit + xact_rollback) from pg_stat_database"
            return int(await connection.scalar(sa.text(query)) or 0)
    finally:
        await engine.dispose()


class Load:
    """Requests through the control plane, each timed and counted by route."""

    def __init__(self, state: ClusterState) -> None:
        self.client = httpx.AsyncClient(
            base_url=state.control.url,
            headers={"X-API-Key": state.api_key},
            timeout=120,
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=512),
        )
        self.times: dict[str, list[float]] = collections.defaultdict(list)
        self.errors: collections.Counter[str] = collections.Counter()
        self.ids: list[str] = []

    async def call(self, route: str, method: str, path: str, start: float, **kw: Any) -> Any:
        try:
            answer = await self.client.request(method, path, **kw)
        except httpx.HTTPError as exc:
            self.errors[f"{route} {type(exc).__name__}"] += 1
            return None
        self.times[route].append(time.perf_counter() - start)
        if answer.status_code >= 400:
            self.errors[f"{route} {answer.status_code}"] += 1
            return None
        return answer

    async def create(self, start: float) -> None:
        body = {"templateID": "base", "timeout": TIMEOUT}
        answer = await self.call("create", "POST", "/v2/sandboxes", start, json=body)
        if answer is not None:
            self.ids.append(answer.json()["sandboxID"])

    async def get(self, start: float) -> None:
        if self.ids:
            await self.call("get", "GET", f"/sandboxes/{random.choice(self.ids)}", start)

    async def list_page(self, start: float) -> None:
        await self.call("list_page", "GET", "/v2/sandboxes", start, params={"limit": PAGE})

    async def kill(self, start: float) -> None:
        if self.ids:
            sandbox_id = self.ids.pop(random.randrange(len(self.ids)))
            await self.call("kill", "DELETE", f"/sandboxes/{sandbox_id}", start)

    def reset(self) -> None:
        self.times.clear()
        self.errors.clear()


async def populate(load: Load, count: int, workers: int) -> float:
    """`count` sandboxes through the control plane, `workers` at a time; creates/s."""
    queue = iter(range(count))
    began = time.perf_counter()

    async def worker() -> None:
        for _ in queue:
            await load.create(time.perf_counter())

    await asyncio.gather(*(worker() for _ in range(workers)))
    return count / (time.perf_counter() - began)


async def steady(load: Load, rate: float, seconds: float) -> int:
    """Open loop: request i starts at i/rate whatever the earlier ones do; how many."""
    kinds = list(MIX)
    weights = [MIX[k] for k in kinds]
    total = int(rate * seconds)
    began = time.perf_counter()
    tasks = []
    for i in range(total):
        scheduled = began + i / rate
        await asyncio.sleep(max(0.0, scheduled - time.perf_counter()))
        kind = random.choices(kinds, weights)[0]
        tasks.append(asyncio.create_task(getattr(load, kind)(scheduled)))
    await asyncio.gather(*tasks)
    return total


def create_ratio(state: ClusterState, node_url: str, rounds: int) -> dict[str, Any]:
    """Creates (then kills) alternately straight to `node_url` and through the control
    plane, which places where it likes; seconds per create each way and their ratio."""
    headers = {"X-API-Key": state.api_key}
    body = {"templateID": "base", "timeout": TIMEOUT}
    times: dict[str, list[float]] = {"node": [], "control": []}
    for _ in range(rounds):
        for way, url in (("node", node_url), ("control", state.control.url)):
            start = time.perf_counter()
            made = httpx.post(f"{url}/v2/sandboxes", json=body, headers=headers, timeout=600)
            times[way].append(time.perf_counter() - start)
            made.raise_for_status()
            sandbox_id = made.json()["sandboxID"]
            httpx.delete(f"{state.control.url}/sandboxes/{sandbox_id}", headers=headers,
                         timeout=120).raise_for_status()  # fmt: skip
    node, control = statistics.median(times["node"]), statistics.median(times["control"])
    return {"node_ms": round(1000 * node, 1), "control_ms": round(1000 * control, 1),
            "ratio": round(control / node, 2)}  # fmt: skip


def list_everything(state: ClusterState) -> tuple[list[dict[str, Any]], list[float]]:
    """Every sandbox, page by page; the time of each page."""
    headers = {"X-API-Key": state.api_key}
    listed: list[dict[str, Any]] = []
    times, token = [], None
    with httpx.Client(base_url=state.control.url, headers=headers, timeout=120) as api:
        while True:
            params: dict[str, Any] = {"limit": PAGE, **({"nextToken": token} if token else {})}
            start = time.perf_counter()
            page = api.get("/v2/sandboxes", params=params)
            times.append(time.perf_counter() - start)
            page.raise_for_status()
            listed += page.json()
            token = page.headers.get("x-next-token")
            if not token:
                return listed, times


def lose_nodes(state: ClusterState, pid: int, names: set[str]) -> dict[str, Any]:
    """SIGKILL the process of the hollow nodes `names`; once the control plane says they
    are lost, every sandbox's state: listed ones by state, the lost nodes' ones answering
    404 with their loss and listed as lost."""
    headers = {"X-API-Key": state.api_key}
    api = httpx.Client(base_url=state.control.url, headers=headers, timeout=120)
    before, _ = list_everything(state)
    on_lost = asyncio.run(_sandboxes_on(state.state_url, names))
    os.kill(pid, signal.SIGKILL)
    killed = time.perf_counter()
    while {n["name"] for n in api.get("/nodes").json() if n["state"] == "lost"} < names:
        time.sleep(0.2)
    declared = time.perf_counter() - killed
    after, _ = list_everything(state)
    lost = {s["sandboxID"] for s in api.get("/lost-sandboxes").json()}
    answers = collections.Counter(
        "lost (404)" if "was lost with node" in (a := api.get(f"/sandboxes/{i}")).text
        else str(a.status_code)
        for i in on_lost
    )  # fmt: skip
    return {
        "nodes_lost": len(names),
        "declared_lost_after_s": round(declared, 1),
        "sandboxes_before": len(before),
        "on_lost_nodes": len(on_lost),
        "listed_after_by_state": dict(collections.Counter(s["state"] for s in after)),
        "still_listed_from_lost_nodes": len({s["sandboxID"] for s in after} & set(on_lost)),
        "in_lost_listing": len(lost & set(on_lost)),
        "their_answers": dict(answers),
    }


async def _sandboxes_on(state_url: str, names: set[str]) -> list[str]:
    """The sandboxes the state store records on the nodes `names`."""
    engine = create_async_engine(engine_url(state_url))
    try:
        async with engine.connect() as connection:
            query = sa.text("select sandbox_id from sandboxes where node = any(:names)")
            return list((await connection.scalars(query, {"names": sorted(names)})).all())
    finally:
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hollow", type=int, default=200)
    parser.add_argument("--real", type=int, default=2)
    parser.add_argument("--lose", type=int, default=10)
    parser.add_argument("--sandboxes", type=int, default=20000)
    parser.add_argument("--rates", default="50,100,200", help="steady rungs, requests/s")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=8, help="creates each way for the ratio")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="aenv-scale-", dir="/tmp"))
    local = LocalCluster(directory, env=ENV)
    state = local.up(args.real)
    try:
        node_url = next(m.url for m in state.members if m.role == "node")
        emit(bench="control_scale", phase="create_real_node", real_nodes=args.real,
             **create_ratio(state, node_url, args.rounds))  # fmt: skip
        started = time.perf_counter()
        kept = args.hollow - args.lose
        fleets = [local.add_hollow(min(PER_PROCESS, kept - first), HOLLOW_ENV)
                  for first in range(0, kept, PER_PROCESS)]  # fmt: skip
        doomed = local.add_hollow(args.lose, HOLLOW_ENV)
        for fleet in (*fleets, doomed):
            # Below the control plane, whose own cost is measured (the nodes' loops would
            # otherwise take its cores: here 200 nodes share 2).
            os.setpriority(os.PRIO_PGRP, fleet.pid, FLEET_NICENESS)
        state = local.load() or state
        emit(bench="control_scale", phase="hollow_up", hollow_nodes=args.hollow,
             seconds=round(time.perf_counter() - started, 1))  # fmt: skip
        asyncio.run(_loaded(state, args))
        names = {f"hollow-{i:03d}" for i in range(doomed.index, doomed.index + doomed.nodes)}
        emit(bench="control_scale", phase="lose", **lose_nodes(state, doomed.pid, names))
        listed, times = list_everything(state)
        emit(bench="control_scale", phase="list_all", sandboxes=len(listed), pages=len(times),
             seconds=round(sum(times), 2), **quantiles(times))  # fmt: skip
    finally:
        local.down()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


async def _loaded(state: ClusterState, args: argparse.Namespace) -> None:
    load = Load(state)
    rate = await populate(load, args.sandboxes, 32)
    emit(bench="control_scale", phase="populate", sandboxes=len(load.ids),
         creates_per_s=round(rate, 1), errors=dict(load.errors),
         **{f"create_{k}": v for k, v in quantiles(load.times["create"]).items()})  # fmt: skip
    # Now that the real nodes are full and every hollow node holds `base`, the control
    # plane places on hollow nodes like the one a create goes straight to.
    nodes = (await load.client.get("/nodes")).json()
    hollow_url = next(n["url"] for n in nodes if n["capacity"]["hollow"])
    emit(bench="control_scale", phase="create_hollow_node",
         **await asyncio.to_thread(create_ratio, state, hollow_url, args.rounds))  # fmt: skip
    for rate in (float(r) for r in args.rates.split(",")):
        await _steady_rung(state, load, rate, args.seconds)
    await load.client.aclose()


async def _steady_rung(state: ClusterState, load: Load, rate: float, seconds: float) -> None:
    load.reset()
    control = state.control
    cpu, said = cpu_seconds(control.pid), statements(control.url)
    transactions, began = await pg_transactions(state.state_url), time.perf_counter()
    total = await steady(load, rate, seconds)
    elapsed = time.perf_counter() - began
    cpu, said = cpu_seconds(control.pid) - cpu, statements(control.url) - said
    transactions = await pg_transactions(state.state_url) - transactions
    emit(bench="control_scale", phase="steady", rate=rate, seconds=round(elapsed, 1),
         requests=total, errors=dict(load.errors),
         control_cpu_ms_per_request=round(1000 * cpu / total, 2),
         state_statements_per_request=round(said / total, 1),
         pg_transactions_per_s=round(transactions / elapsed, 1),
         routes={route: quantiles(times) for route, times in load.times.items()})  # fmt: skip


if __name__ == "__main__":
    main()
