"""Hollow nodes for real: PostgreSQL, an S3 server and a control plane as processes, and
twelve hollow nodes in one more process (`agentenv/cluster/hollow.py`), driven through the
control URL. They run the node's code (registration, heartbeats, admission, the
lifecycle, the relays) and start no guest; a production control plane ignores them."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from agentenv.cluster.local import ClusterState, LocalCluster, Member
from agentenv.cluster.postgres import free_port
from agentenv.wire import ENVD_PORT, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER

from ..live import AENV, wait_for

NODES = 12
# Twelve hollow nodes beat in one process: on a loaded machine (a VM test on the other
# worker) a beat came late enough for a node to miss a burst as silent.
NODE_TIMEOUT = 10.0


class Fleet:
    def __init__(self, local: LocalCluster, state: ClusterState, member: Member) -> None:
        self.local, self.state, self.member = local, state, member
        self.api = httpx.Client(
            base_url=state.control.url, headers={"X-API-Key": state.api_key}, timeout=60
        )

    def create_many(self, count: int) -> list[dict]:
        body = {"templateID": "base"}
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: self.api.post("/sandboxes", json=body), range(count)))
        assert [a.status_code for a in answers] == [201] * count, answers[0].text
        return [a.json() for a in answers]


@pytest.fixture(scope="module")
def fleet(kit_ready: None) -> Iterator[Fleet]:
    directory = Path(tempfile.mkdtemp(prefix="aenv-hollow-", dir="/tmp"))
    local = LocalCluster(
        directory,
        env={
            "AENV_CLUSTER_ACCEPT_HOLLOW_NODES": "true",
            "AENV_CLUSTER_HEARTBEAT_INTERVAL": "1",
            "AENV_CLUSTER_NODE_TIMEOUT": str(NODE_TIMEOUT),
            "AENV_SERVER_CODE_INTERPRETER": "false",
        },
    )
    state = local.up(0)
    try:
        member = local.add_hollow(NODES)
        yield Fleet(local, local.load() or state, member)
    finally:
        local.down()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


def test_hollow_nodes_serve_the_control_plane_as_nodes_do(fleet: Fleet) -> None:
    """A burst spreads over every hollow node; get, list pages and kill go through the
    control plane to them; a sandbox's own traffic is refused on this host, clearly."""
    nodes = {n["name"]: n for n in fleet.api.get("/nodes").json()}
    assert len(nodes) == NODES and all(n["capacity"]["hollow"] for n in nodes.values())
    made = fleet.create_many(3 * NODES)
    placed = collections.Counter(
        fleet.api.get(f"/sandboxes/{s['sandboxID']}").json()["node"] for s in made
    )
    seen = [(n["name"], n["heartbeatAgeSeconds"]) for n in fleet.api.get("/nodes").json()]
    assert set(placed) == set(nodes) and max(placed.values()) <= 4, (placed, seen)
    listed, token = [], None
    while True:
        params = {"limit": 10, **({"nextToken": token} if token else {})}
        page = fleet.api.get("/v2/sandboxes", params=params)
        assert page.status_code == 200, page.text
        listed += [s["sandboxID"] for s in page.json()]
        token = page.headers.get("x-next-token")
        if not token:
            break
    assert sorted(listed) == sorted(s["sandboxID"] for s in made)
    # The guest's address is on loopback, where nothing answers: refused here, not routed.
    envd = fleet.api.get(
        "/health",
        headers={SANDBOX_ID_HEADER: made[0]["sandboxID"], SANDBOX_PORT_HEADER: str(ENVD_PORT)},
    )
    assert envd.status_code == 502 and envd.json()["message"], envd.text
    for sandbox in made:
        assert fleet.api.delete(f"/sandboxes/{sandbox['sandboxID']}").status_code == 204
    assert fleet.api.get("/v2/sandboxes").json() == []


def test_a_production_control_plane_sends_hollow_nodes_nothing(fleet: Fleet) -> None:
    """A control plane on the same stores without `cluster.accept_hollow_nodes` counts no
    node and places nothing: a create is a clear 503."""
    port = free_port()
    env = {**os.environ, **fleet.local._common_env(fleet.state, port)}
    env.pop("AENV_CLUSTER_ACCEPT_HOLLOW_NODES")
    env |= {"AENV_SERVER_ROLE": "control", "AENV_HOME": str(fleet.local.directory / "control-2")}
    proc = subprocess.Popen([AENV, "server"], env=env, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: _answers(url), 60)
        headers = {"X-API-Key": fleet.state.api_key}
        assert httpx.get(f"{url}/health").json()["nodes"] == 0
        refused = httpx.post(f"{url}/sandboxes", json={"templateID": "base"}, headers=headers)
        assert refused.status_code == 503 and "no node" in refused.json()["message"], refused.text
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_pulled_plug_on_hollow_nodes_reports_their_sandboxes_lost(fleet: Fleet) -> None:
    """Runs last: SIGKILL the process of every hollow node; after the timeout each of their
    running sandboxes answers 404 naming its node, and operators find them listed."""
    made = fleet.create_many(NODES)
    os.kill(fleet.member.pid, signal.SIGKILL)
    assert wait_for(
        lambda: all(n["state"] == "lost" for n in fleet.api.get("/nodes").json()),
        NODE_TIMEOUT + 20,
    )
    lost = {s["sandboxID"]: s for s in fleet.api.get("/lost-sandboxes").json()}
    for sandbox in made:
        answer = fleet.api.get(f"/sandboxes/{sandbox['sandboxID']}")
        assert answer.status_code == 404 and "was lost with node 'hollow-" in answer.text
        assert lost[sandbox["sandboxID"]]["state"] == "running"


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
