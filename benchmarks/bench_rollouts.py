"""RL rollouts under load, through the unmodified E2B SDK (async): ladders of concurrent
workers, each running episodes of create from a snapshot → 3 commands → write a file →
rollback to the snapshot (our route; the SDK has none) → kill.

Per rung: per-step p50/p99, episodes/s, errors by kind, and the ratio of episodes/s to
the CPU-bound floor measured in the same run: the raw QEMU driver restoring as many
guests at once as the rung has workers, on the same cores (`rawguest.RawGuest`). An
episode restores a guest twice (its create and its rollback), so the floor's episodes/s
is half its restores/s; the commands and the file an episode runs in between are ours
to pay. A second floor is the whole episode with no platform: the raw driver's restores,
and the same commands and file asked of the guest's agent straight from its namespace;
against it, what is left is what the platform costs. Where the cores went is counted
too, per episode and per raw restore: the platform's processes (a server, or a cluster's
control plane, nodes, S3 and PostgreSQL), this client, and the rest of the machine:
mostly the guests' QEMUs, with the node's short-lived helpers (ip, iptables, qemu-img)
and a cluster's PostgreSQL backends.

Goals (issue 26): no errors (overload is a wait or a 429 the SDK retries), p99 ≤ 3 times
p50, episodes/s ≥ 0.7 of the floor (both are reported: the restores alone, and the raw
episode).

On one node, or with `--nodes N` through the control plane of a local cluster of N nodes
(on the same cores). Run: `python -m benchmarks.bench_rollouts [--workers 1 4 8 16 32]
[--episodes 3] [--nodes 2]`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from e2b import AsyncSandbox

from agentenv.cluster.local import LocalCluster

from .bench_pause import p50, p99
from .cpu import cpu_seconds, machine_busy_seconds
from .harness import live_server, wait_snapshot
from .rawguest import RawGuest

STEPS = ("create", "commands", "write", "rollback", "kill")
COMMANDS = ("echo step", "ls /home/user", "cat /etc/hostname")
ANSWER_PATH, ANSWER = "/home/user/answer.txt", b"42"
# Guests an episode restores: its create and its rollback.
RESTORES_PER_EPISODE = 2
# Retries of a 429 or 503 with Retry-After, as the SDKs make of their own calls.
RETRIES = 3
CLUSTER_ENV = {
    "AENV_SANDBOX_MEMORY_MB": "256",
    "AENV_SERVER_CODE_INTERPRETER": "false",
    "AENV_SERVER_LOG_FORMAT": "text",
}


@dataclass(frozen=True)
class Endpoint:
    """Where the SDK and the rollback go: a node, or a cluster's control plane."""

    url: str
    api_key: str
    nodes: int
    # The settings it was started with (where its boot snapshots are).
    env: dict[str, str]
    # The platform's long-lived processes, whose CPU is counted apart from the guests'.
    pids: tuple[int, ...]
    # Every node's home lies under it.
    root: Path


@dataclass(frozen=True)
class CpuReading:
    """CPU-seconds used so far: by the whole machine, the platform and this client."""

    machine: float
    platform: float
    client: float

    @classmethod
    def now(cls, pids: tuple[int, ...]) -> CpuReading:
        platform = sum(cpu_seconds(pid) for pid in pids)
        return cls(machine_busy_seconds(), platform, time.process_time())

    def shares_since(self, earlier: CpuReading, per: int) -> dict[str, float]:
        """Each share since `earlier`, per `per` (episodes); the rest is mostly the guests'."""
        machine = (self.machine - earlier.machine) / per
        platform = (self.platform - earlier.platform) / per
        client = (self.client - earlier.client) / per
        return {
            "cpu_s": round(machine, 3),
            "platform_cpu_s": round(platform, 3),
            "client_cpu_s": round(client, 3),
            "rest_cpu_s": round(machine - platform - client, 3),
        }


async def rollback(api: Endpoint, sandbox_id: str, snapshot: str) -> None:
    """Our rollback route (the SDK has none), retried as the SDK retries its own calls:
    a 429 or 503 with `Retry-After`, up to `RETRIES` times."""
    statuses: list[str] = []
    async with httpx.AsyncClient(base_url=api.url, timeout=120) as client:
        for attempt in range(RETRIES + 1):
            answer = await client.post(
                f"/sandboxes/{sandbox_id}/rollback",
                json={"snapshotID": snapshot},
                headers={"X-API-Key": api.api_key},
            )
            statuses.append(str(answer.status_code))
            wait = answer.headers.get("retry-after")
            if answer.status_code not in (429, 503) or wait is None or attempt == RETRIES:
                break
            await asyncio.sleep(float(wait))
        if answer.is_error:
            # The statuses before it say whether a retry met what an earlier try left.
            raise RuntimeError(f"rollback {' then '.join(statuses)}: {answer.text[:300]}")


async def episode(api: Endpoint, snapshot: str, timings: dict[str, list[float]]) -> None:
    """One episode; each step's seconds go to `timings`."""

    async def step(name: str, work):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        result = await work
        timings[name].append(time.perf_counter() - start)
        return result

    sandbox = await step("create", AsyncSandbox.create(snapshot))
    try:

        async def commands() -> None:
            for command in COMMANDS:
                await sandbox.commands.run(command)

        await step("commands", commands())
        await step("write", sandbox.files.write(ANSWER_PATH, ANSWER))
        await step("rollback", rollback(api, sandbox.sandbox_id, snapshot))
    finally:
        await step("kill", sandbox.kill())


async def rung(api: Endpoint, snapshot: str, workers: int, episodes: int) -> dict:
    timings: dict[str, list[float]] = {name: [] for name in STEPS}
    errors: collections.Counter[str] = collections.Counter()

    async def worker() -> None:
        for _ in range(episodes):
            try:
                await episode(api, snapshot, timings)
            except Exception as exc:
                print(f"episode failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                # The status says which overload, if any: kept apart by kind.
                kind = type(exc).__name__
                errors[f"{kind}: {exc}"[:80] if isinstance(exc, RuntimeError) else kind] += 1

    before, start = CpuReading.now(api.pids), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    wall = time.perf_counter() - start
    done = workers * episodes - sum(errors.values())
    used = CpuReading.now(api.pids).shares_since(before, max(done, 1))
    return {
        "nodes": api.nodes,
        "workers": workers,
        "episodes": workers * episodes,
        "episodes_per_s": round(done / wall, 3),
        "errors": dict(errors),
        **{f"episode_{share}": seconds for share, seconds in used.items()},
        **{f"{n}_p50_s": p50(t) for n, t in timings.items() if t},
        **{f"{n}_p99_s": p99(t) for n, t in timings.items() if t},
    }


@asynccontextmanager
async def raw_guests(count: int) -> AsyncIterator[list[RawGuest]]:
    """`count` raw guests, each in a namespace of its own, none started yet."""
    with tempfile.TemporaryDirectory(prefix="aenv-floor-") as tmp:
        guests: list[RawGuest] = []
        try:
            for i in range(count):
                (Path(tmp) / str(i)).mkdir()
                guests.append(await RawGuest(Path(tmp) / str(i), name=f"f{i}").__aenter__())
            yield guests
        finally:
            for guest in guests:
                await guest.__aexit__(None, None, None)


async def floor(snapshot: Path, workers: int, rounds: int) -> tuple[float, float]:
    """Restores per second of the raw driver, `workers` at once, `rounds` times, and the
    machine's CPU-seconds per restore."""
    async with raw_guests(workers) as guests:
        busy, start = machine_busy_seconds(), time.perf_counter()
        for _ in range(rounds):
            await asyncio.gather(*(g.restore(snapshot) for g in guests))
            await asyncio.gather(*(g.stop() for g in guests))
        return _per_second_and_cpu(workers * rounds, start, busy)


async def raw_episodes(snapshot: Snapshot, workers: int, rounds: int) -> tuple[float, float]:
    """Episodes per second with no platform at all, `workers` at once, and the machine's
    CPU-seconds per episode: the raw driver restores a guest from the episodes' snapshot
    (its files, as the node keeps them), its agent is asked the episode's commands and
    file straight from its namespace, and it is restored again (the rollback) and
    stopped."""
    async with raw_guests(workers) as guests:

        async def worker(guest: RawGuest) -> None:
            for _ in range(rounds):
                await guest.restore_with_disk(snapshot.files)
                await guest.work(snapshot.access_token, COMMANDS, ANSWER_PATH, ANSWER)
                await guest.stop()
                await guest.restore_with_disk(snapshot.files)
                await guest.stop()

        busy, start = machine_busy_seconds(), time.perf_counter()
        await asyncio.gather(*(worker(guest) for guest in guests))
        return _per_second_and_cpu(workers * rounds, start, busy)


def _per_second_and_cpu(done: int, start: float, busy: float) -> tuple[float, float]:
    """`done` per second since `start`, and the machine's CPU-seconds per one since `busy`."""
    return done / (time.perf_counter() - start), (machine_busy_seconds() - busy) / done


@dataclass(frozen=True)
class Snapshot:
    """What every episode starts from: a sandbox with a little state, snapshotted."""

    snapshot_id: str
    # Where a node keeps its files.
    files: Path
    # Its guest's access token, which a restored guest keeps until a node's `/init`.
    access_token: str


async def prepare(api: Endpoint) -> Snapshot:
    sandbox = await AsyncSandbox.create()
    await sandbox.files.write("/home/user/task.txt", "solve it")
    snapshot = await sandbox.create_snapshot()
    await sandbox.kill()
    name, tag = snapshot.snapshot_id.split(":")
    files = next(api.root.glob(f"**/snapshots/{name}/{tag}"))
    assert sandbox._envd_access_token is not None
    return Snapshot(snapshot.snapshot_id, files, sandbox._envd_access_token)


async def ladder(api: Endpoint, args: argparse.Namespace) -> None:
    prepared = await prepare(api)
    snapshot = prepared.snapshot_id
    boot = wait_snapshot(api)  # 256 MiB guests, as RawGuest's
    for workers in args.workers:
        result = await rung(api, snapshot, workers, args.episodes) | {"bench": "rollouts"}
        try:
            raw, raw_cpu = await floor(boot, workers, args.episodes)
        except TimeoutError:
            # Reported, not fatal: the rung's own figures stand without their floor.
            result["floor_error"] = f"{workers} raw restores at once did not all answer"
            print(json.dumps(result), flush=True)
            continue
        per_episode = raw / RESTORES_PER_EPISODE
        result |= {
            "floor_restores_per_s": round(raw, 3),
            "floor_restore_cpu_s": round(raw_cpu, 3),
            "floor_episodes_per_s": round(per_episode, 3),
            "episodes_over_floor": round(result["episodes_per_s"] / per_episode, 2),
        }
        try:
            bare, bare_cpu = await raw_episodes(prepared, workers, args.episodes)
        except TimeoutError:
            result["raw_episodes_error"] = f"{workers} raw episodes at once did not all finish"
        else:
            result |= {
                "raw_episodes_per_s": round(bare, 3),
                "raw_episode_cpu_s": round(bare_cpu, 3),
                "episodes_over_raw_episodes": round(result["episodes_per_s"] / bare, 2),
            }
        print(json.dumps(result), flush=True)


@contextmanager
def endpoint(nodes: int) -> Iterator[Endpoint]:
    """One node's server, or a local cluster of `nodes` nodes."""
    if nodes <= 1:
        with live_server() as server:
            assert server.proc is not None
            pids = (server.proc.pid,)
            yield Endpoint(server.url, server.api_key, 1, server.env, pids, server.home)
        return
    with tempfile.TemporaryDirectory(prefix="aenv-bench-rollouts-", dir="/tmp") as tmp:
        cluster = LocalCluster(Path(tmp), env=CLUSTER_ENV)
        state = cluster.up(nodes)
        try:
            pids = tuple(member.pid for member in state.members)
            env = dict(os.environ)
            yield Endpoint(state.control.url, state.api_key, nodes, env, pids, Path(tmp))
        finally:
            cluster.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1, help="2 or more: a local cluster")
    args = parser.parse_args()
    # Servers start and stop outside the event loop (a node's close runs one of its own).
    with endpoint(args.nodes) as api:
        os.environ.update(
            {"E2B_API_URL": api.url, "E2B_SANDBOX_URL": api.url, "E2B_API_KEY": api.api_key}
        )
        asyncio.run(ladder(api, args))


if __name__ == "__main__":
    main()
