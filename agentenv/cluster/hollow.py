"""Hollow nodes: many of a cluster's nodes in one process, for tests and benchmarks of the
control plane at scale (Kubernetes' kubemark is the model).

Each is the real node: its API, registration and heartbeats, admission, the lifecycle and
its state-store writes, answering the control plane's relays. Only its machines are hollow
(`runtime/machine/host.py`): no guest, namespace, block daemon, egress proxy or NFS server.
Nothing in `aenv server` starts one, and a control plane places sandboxes on them only
with `cluster.accept_hollow_nodes`, so a production configuration never sends them work.

    python -m agentenv.cluster.hollow --first 1 --count 100 --home DIR

takes the shared settings (state store, object store, API key) from AENV_* variables like
any node, and prints one line per node once every node listens.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import socket
from pathlib import Path

import uvicorn

from ..api.app import create_app
from ..config import Config, load_config
from ..observe.logs import configure_logging

NAME_PREFIX = "hollow"
HOLLOW_SUBNET = "127.199.0.0/16"


def hollow_name(index: int) -> str:
    return f"{NAME_PREFIX}-{index:03d}"


def hollow_config(base: Config, index: int, home: Path, host: str, port: int) -> Config:
    """One hollow node's settings: `base`'s stores and limits, its own name, home and
    address; nothing that needs a guest (boot snapshots, a warm pool, the interpreter)."""
    cfg = copy.deepcopy(base)
    name = hollow_name(index)
    cfg.server.role = "node"
    cfg.server.node_name = name
    cfg.server.host, cfg.server.port = host, port
    cfg.server.advertise_url = f"http://{host}:{port}"
    cfg.server.code_interpreter = False
    cfg.paths.home = str(home / name)
    cfg.net.name_prefix = f"h{index:03d}"
    # Where its sandboxes' routes lead: loopback, where no guest answers, so a request
    # to one is refused on this host and never routed anywhere else.
    cfg.net.host_subnet = HOLLOW_SUBNET
    cfg.sandbox.boot_snapshots = False
    cfg.sandbox.warm_pool = 0
    return cfg


async def serve_fleet(base: Config, first: int, count: int, home: Path, host: str) -> None:
    """Serve hollow nodes `first`..`first+count-1` until cancelled."""
    servers: list[tuple[uvicorn.Server, socket.socket]] = []
    for index in range(first, first + count):
        listener = socket.create_server((host, 0))
        cfg = hollow_config(base, index, home, host, listener.getsockname()[1])
        Path(cfg.paths.home).mkdir(parents=True, exist_ok=True)
        config = uvicorn.Config(
            create_app(cfg, hollow=True), log_config=None, lifespan="on", access_log=False
        )
        servers.append((uvicorn.Server(config), listener))
    tasks = [asyncio.create_task(s.serve(sockets=[listener])) for s, listener in servers]
    while not all(s.started for s, _ in servers):
        if done := [t for t in tasks if t.done()]:
            await done[0]  # a node that failed to start says why
            raise RuntimeError("a hollow node stopped while starting")
        await asyncio.sleep(0.1)
    for index, (_, listener) in zip(range(first, first + count), servers, strict=True):
        print(f"{hollow_name(index)} http://{host}:{listener.getsockname()[1]}", flush=True)
    await asyncio.gather(*tasks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", type=int, default=1, help="index of the first node")
    parser.add_argument("--count", type=int, required=True, help="how many nodes")
    parser.add_argument("--home", type=Path, required=True, help="their homes go under it")
    parser.add_argument("--host", default="127.0.0.1", help="address they listen on")
    args = parser.parse_args(argv)
    base = load_config()
    configure_logging(base.server.log_format)
    asyncio.run(serve_fleet(base, args.first, args.count, args.home, args.host))


if __name__ == "__main__":
    main()
