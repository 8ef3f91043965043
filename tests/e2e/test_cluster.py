"""A local cluster for real: Debian's PostgreSQL, an S3 server, a control plane and three
nodes as processes (`aenv cluster up --registry`), used through the control URL only by
the unmodified E2B SDK; placement, images from the cluster's registry, a second control
replica, node loss, and `down`."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import httpx
import pytest
from e2b import Sandbox, Template, Volume
from playwright.sync_api import Browser, expect

from agentenv.cluster.local import BUCKET, S3_KEYS, ClusterState, LocalCluster, Member
from agentenv.cluster.postgres import free_port
from agentenv.net.netns import link_exists

from ..browser import run_in_terminal, signed_in
from ..images.oci_build import build_image, busybox_layer, push_image
from ..live import AENV, HostResources, point_sdk, wait_for
from ..netlab import lab, probe_command, reached
from ..vmfactory import SETTLE_S
from .test_proxy import GUEST_DIR, echo_twice
from .test_snapshots import TICKER, ticks

pytestmark = pytest.mark.vm

NODE_TIMEOUT = 6.0


class Cluster:
    def __init__(self, local: LocalCluster, state: ClusterState) -> None:
        self.local = local
        self.state = state
        self.url = state.control.url
        self.api = httpx.Client(
            base_url=self.url, headers={"X-API-Key": state.api_key}, timeout=120
        )

    def node_of(self, sandbox_id: str) -> str:
        return self.api.get(f"/sandboxes/{sandbox_id}").json()["node"]

    def nodes(self) -> dict[str, dict]:
        return {n["name"]: n for n in self.api.get("/nodes").json()}

    def s3(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.state.s3_endpoint,
            aws_access_key_id=S3_KEYS["access_key"],
            aws_secret_access_key=S3_KEYS["secret_key"],
            region_name="us-east-1",
        )

    def pid(self, name: str) -> int:
        return next(m.pid for m in self.state.members if m.name == name)


def _show_logs(request: pytest.FixtureRequest, state: ClusterState) -> None:
    """The members' log tails, straight to the terminal: the directory goes next."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        for member in state.members:
            try:
                lines = Path(member.log).read_text(errors="replace").splitlines()[-40:]
            except OSError:
                continue
            print(f"\n--- {member.name} ({member.log}) ---", *lines, sep="\n")


@pytest.fixture(scope="module")
def cluster(kit_ready: None, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    directory = Path(tempfile.mkdtemp(prefix="aenv-cluster-", dir="/tmp"))
    failed_before = request.session.testsfailed
    local = LocalCluster(
        directory,
        env={
            "AENV_SANDBOX_MEMORY_MB": "256",
            "AENV_CLUSTER_HEARTBEAT_INTERVAL": "1",
            "AENV_CLUSTER_NODE_TIMEOUT": str(NODE_TIMEOUT),
            "AENV_SERVER_CODE_INTERPRETER": "false",
            "AENV_REGISTRY_PULL_ON_CREATE": "true",
        },
    )
    state = local.up(3, registry=True)
    try:
        # The SDK's three variables, for the module's tests; put back as they were after.
        with pytest.MonkeyPatch.context() as environment:
            point_sdk(environment, state.control.url, state.api_key)
            yield Cluster(local, state)
    finally:
        if request.session.testsfailed > failed_before:
            _show_logs(request, state)
        local.down()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


def _live_nodes(cluster: Cluster) -> list[Member]:
    return [m for m in cluster.state.members if m.role == "node" and _alive(m.pid)]


def _node_resources(cluster: Cluster, node: Member) -> HostResources:
    """What the node's sandboxes hold on the host (their veths are in the node's own
    namespace, out of sight here; everything else is counted)."""
    prefix = cluster.state.network.node_prefix(node.index)
    return HostResources.measure(Path(node.home), prefix).transient()


def _sandbox_ids(cluster: Cluster) -> set[str]:
    return {s["sandboxID"] for s in cluster.api.get("/v2/sandboxes").json()}


@pytest.fixture(autouse=True)
def nodes_back_to_baseline(cluster: Cluster) -> Iterator[None]:
    """The sandboxes a test made are killed through the control plane after it, and each
    node that lived through the test holds on the host what it held before."""
    before = {node.name: _node_resources(cluster, node) for node in _live_nodes(cluster)}
    sandboxes = _sandbox_ids(cluster)
    yield
    if not _alive(cluster.state.control.pid):
        return  # `down`: the test itself checks that nothing is left
    for sandbox_id in _sandbox_ids(cluster) - sandboxes:
        cluster.api.delete(f"/sandboxes/{sandbox_id}")
    for node in (n for n in _live_nodes(cluster) if n.name in before):
        kept = before[node.name]
        settled = wait_for(
            lambda node=node, kept=kept: _node_resources(cluster, node).within(kept), SETTLE_S
        )
        assert settled, (node.name, kept, _node_resources(cluster, node))


def test_the_sdk_works_through_the_control_url(cluster: Cluster) -> None:
    sandbox = Sandbox.create()
    try:
        assert sandbox.commands.run("echo hello").stdout == "hello\n"
        sandbox.files.write("/tmp/f", "content")
        node = cluster.node_of(sandbox.sandbox_id)
        assert node in cluster.nodes()
        # Its disk is the cluster's one `base`, published to S3 and served by its node's
        # block daemon (listed once among the templates).
        stored = cluster.s3().get_object(Bucket=BUCKET, Key="templates/base.json")
        top = json.loads(stored["Body"].read())["layers"][-1]
        assert wait_for(lambda: top in cluster.nodes()[node]["capacity"]["layers"], 10)
        listed_templates = [t["templateID"] for t in cluster.api.get("/templates").json()]
        assert listed_templates.count("base") == 1
        listed = [s for s in Sandbox.list().next_items() if s.sandbox_id == sandbox.sandbox_id]
        assert listed and listed[0].state.value == "running"
        # A request id given to the control plane reaches the node and comes back.
        request_id = "trace-" + sandbox.sandbox_id
        answer = cluster.api.get(
            f"/sandboxes/{sandbox.sandbox_id}/metrics", headers={"X-Request-Id": request_id}
        )
        assert answer.status_code == 200 and answer.headers["x-request-id"] == request_id
        node_log = next(m.log for m in cluster.state.members if m.name == node)
        assert request_id in Path(node_log).read_text()
        sandbox.pause()
        resumed = Sandbox.connect(sandbox.sandbox_id)
        assert resumed.files.read("/tmp/f") == "content"
        assert cluster.node_of(sandbox.sandbox_id) == node  # resumed where its files are
    finally:
        sandbox.kill()
    assert cluster.api.get(f"/sandboxes/{sandbox.sandbox_id}").status_code == 404


def test_a_template_with_copy_steps_builds_through_the_control_url(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The COPY archive's upload URL names the control plane, which relays it (signed by
    one node, taken by any) with no API key; the build and its sandboxes run on nodes."""
    (tmp_path / "hello.txt").write_text("copied through the control plane\n")
    recipe = (
        Template(file_context_path=str(tmp_path))
        .from_template("base")
        .copy("hello.txt", "/srv/hello.txt")
        .run_cmd("test -s /srv/hello.txt")
    )
    Template.build(recipe, "cluster-copy", cpu_count=1, memory_mb=256)
    sandbox = Sandbox.create("cluster-copy")
    try:
        assert sandbox.files.read("/srv/hello.txt") == "copied through the control plane\n"
    finally:
        sandbox.kill()
    control = urlsplit(cluster.state.control.url).netloc
    files = cluster.api.get("/templates/cluster-copy/files/" + "ab" * 32).json()
    assert urlsplit(files["url"]).netloc == control
    refused = httpx.put(files["url"].replace("signature=", "signature=0"), content=b"x")
    assert refused.status_code == 403


def test_a_volume_is_mounted_on_any_node(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Volumes' files are on the file system the nodes share; each node serves the
    volumes its own sandboxes mount."""
    monkeypatch.setenv("E2B_VOLUME_API_URL", cluster.url)
    volume = Volume.create(f"shared-{time.time_ns()}")
    sandboxes: list[Sandbox] = []
    try:
        volume.write_file("/seed.txt", b"seeded")
        for _ in range(2):
            sandboxes.append(Sandbox.create(volume_mounts={"/mnt/shared": volume}))
        nodes = [cluster.node_of(s.sandbox_id) for s in sandboxes]
        assert len(set(nodes)) == 2, nodes  # placement spread them
        for sandbox, node in zip(sandboxes, nodes, strict=True):
            assert sandbox.commands.run("cat /mnt/shared/seed.txt").stdout == "seeded"
            sandbox.files.write(f"/mnt/shared/{node}.txt", node)
        assert sorted(e.name for e in volume.list("/")) == sorted(
            ["seed.txt", *(f"{node}.txt" for node in nodes)]
        )
        # What one node's guest wrote, the other's reads.
        assert sandboxes[1].commands.run(f"cat /mnt/shared/{nodes[0]}.txt").stdout == nodes[0]
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
        Volume.destroy(volume.volume_id)


def test_traffic_through_the_control_url_wakes_a_paused_sandbox(cluster: Cluster) -> None:
    """Auto-resume behind the control plane: it relays to the paused sandbox's node, whose
    proxy resumes it; the request is then answered."""
    sandbox = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sandbox.commands.run("python3 -m http.server 8000", background=True)
        # Paused only once the server listens: a pause before would leave nothing to answer.
        sandbox.commands.run("until curl -sf -o /dev/null localhost:8000; do sleep 0.2; done")
        sandbox.set_timeout(3)
        assert wait_for(lambda: sandbox.get_info().state.value == "paused", 60)
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}
        answer = httpx.get(cluster.state.control.url + "/", headers=headers, timeout=60)
        assert answer.status_code == 200 and "Directory listing" in answer.text
        assert sandbox.get_info().state.value == "running"
    finally:
        sandbox.kill()


def test_guest_ports_and_websockets_through_the_control_url(cluster: Cluster) -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.files.write("/tmp/ws_echo.py", (GUEST_DIR / "ws_echo.py").read_text())
        sandbox.commands.run("python3 /tmp/ws_echo.py 9000", background=True)
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "9000"}

        def up() -> bool:
            try:
                return httpx.get(cluster.url + "/", headers=headers, timeout=2).status_code != 502
            except httpx.HTTPError:
                return False

        assert wait_for(up, timeout=30)

        ws_url = cluster.url.replace("http://", "ws://") + f"/proxy/{sandbox.sandbox_id}/9000/chat"
        assert asyncio.run(echo_twice(ws_url)) == ["echo:one", "echo:" + "two" * 100]
    finally:
        sandbox.kill()


def test_control_and_nodes_export_metrics(cluster: Cluster) -> None:
    sandbox = Sandbox.create()
    try:
        control = httpx.get(cluster.url + "/metrics").text
        assert 'aenv_nodes{state="active"} 3.0' in control
        assert 'aenv_sandboxes{state="running"}' in control
        assert 'aenv_control_requests_total{kind="create",status="201"}' in control
        node = next(
            m for m in cluster.state.members if m.name == cluster.node_of(sandbox.sandbox_id)
        )
        metrics = httpx.get(node.url + "/metrics").text
        assert 'aenv_operation_seconds_count{operation="create",outcome="ok"}' in metrics
        assert 'aenv_sandboxes{state="running"} 1.0' in metrics
        assert 'aenv_node_memory_mb{kind="committed"} 256.0' in metrics
        assert 'aenv_chunk_cache{kind="hits"}' in metrics
    finally:
        sandbox.kill()


def test_placement_spreads_a_burst_and_follows_a_snapshot(cluster: Cluster) -> None:
    """Six creates at once, before any heartbeat shows one: the placement ledger spreads
    them over the nodes. Then creates from a snapshot go where its files are."""
    with ThreadPoolExecutor(6) as pool:
        sandboxes = list(pool.map(lambda _: Sandbox.create(), range(6)))
    try:
        per_node = collections.Counter(cluster.node_of(s.sandbox_id) for s in sandboxes)
        # Three nodes, six creates: none takes more than half (it did all of them before).
        assert len(per_node) >= 2 and max(per_node.values()) <= 3, per_node
        source = sandboxes[0]
        source.commands.run("echo from-snapshot > /tmp/mark")
        snapshot = source.create_snapshot()
        holder = cluster.node_of(source.sandbox_id)
        # The next heartbeats tell the control plane which node holds the snapshot.
        deadline = time.monotonic() + 10
        while snapshot.snapshot_id not in cluster.nodes()[holder]["capacity"]["snapshots"]:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        children = [Sandbox.create(snapshot.snapshot_id) for _ in range(2)]
        sandboxes += children
        for child in children:
            assert cluster.node_of(child.sandbox_id) == holder
            assert child.commands.run("cat /tmp/mark").stdout == "from-snapshot\n"
    finally:
        for sandbox in sandboxes:
            sandbox.kill()


def test_an_image_pushed_to_the_clusters_registry_starts_by_its_reference(
    cluster: Cluster,
) -> None:
    """An image pushed from the host to the cluster's registry: a create naming it pulls it
    on the node it lands on, as a template every node then starts it from."""
    mark = {"etc/fleet-mark": b"pushed from the host\n"}
    image = build_image([busybox_layer(extra=mark)])
    push_image(f"http://{cluster.state.registry}", "fleet/mark", "v1", image)
    reference = f"{cluster.state.registry}/fleet/mark:v1"
    with ThreadPoolExecutor(3) as pool:
        sandboxes = list(pool.map(lambda _: Sandbox.create(reference), range(3)))
    try:
        for sandbox in sandboxes:
            assert sandbox.commands.run("cat /etc/fleet-mark").stdout == "pushed from the host\n"
        stored = cluster.s3().get_object(Bucket=BUCKET, Key="templates/mark-v1.json")
        assert json.loads(stored["Body"].read())["source"] == reference
        assert len({cluster.node_of(s.sandbox_id) for s in sandboxes}) >= 2
    finally:
        for sandbox in sandboxes:
            sandbox.kill()


def test_two_control_replicas_at_once(cluster: Cluster) -> None:
    port = free_port()
    control = next(m for m in cluster.state.members if m.role == "control")
    env = {**os.environ, **_environ_of(control.pid), "AENV_PORT": str(port)}
    log = open(Path(control.log).with_name("control-2.log"), "ab")
    second = subprocess.Popen([AENV, "server"], env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    urls = [cluster.url, f"http://127.0.0.1:{port}"]
    created: list[str] = []
    try:
        _wait_healthy(urls[1])
        headers = {"X-API-Key": cluster.state.api_key}

        def create(url: str) -> str:
            answer = httpx.post(url + "/v2/sandboxes", json={"templateID": "base"},
                                headers=headers, timeout=300)  # fmt: skip
            assert answer.status_code == 201, answer.text
            return answer.json()["sandboxID"]

        with ThreadPoolExecutor(4) as pool:
            created = list(pool.map(create, urls * 2))
        assert len(set(created)) == 4
        for url in urls:
            listed = httpx.get(url + "/v2/sandboxes", headers=headers).json()
            assert set(created) <= {s["sandboxID"] for s in listed}
    finally:
        for sandbox_id in created:
            cluster.api.delete(f"/sandboxes/{sandbox_id}")
        second.terminate()
        second.wait(30)


def test_network_settings_through_the_control_url(cluster: Cluster) -> None:
    """E2B's newest network settings reach the node, are shown by the control plane
    (never the proxy's password) and are replaced by an update it relays."""
    rule = {"api.site.test": [{"transform": {"headers": {"X-Key": "literal"}}}]}
    proxy = {"address": "198.51.100.1:1080", "username": "u", "password": "p"}
    sandbox = Sandbox.create(
        network={
            "allow_out": ["api.site.test"],
            "deny_out": ["0.0.0.0/0"],
            "dns_servers": ["192.0.2.53"],
            "rules": rule,
            "egress_proxy": proxy,
            "https_ports": [3000],
        }
    )
    try:
        shown = cluster.api.get(f"/sandboxes/{sandbox.sandbox_id}").json()["network"]
        assert shown["rules"] == rule and shown["dnsServers"] == ["192.0.2.53"]
        assert shown["egressProxy"] == {"address": "198.51.100.1:1080", "username": "u"}
        sandbox.update_network({"allow_out": ["192.0.2.10"], "deny_out": ["0.0.0.0/0"]})
        shown = cluster.api.get(f"/sandboxes/{sandbox.sandbox_id}").json()["network"]
        assert shown["allowOut"] == ["192.0.2.10"]
        assert "rules" not in shown and "egressProxy" not in shown
        assert sandbox.commands.run("echo still here").stdout == "still here\n"
        metrics = cluster.api.get("/sandboxes/metrics", params={"sandbox_ids": sandbox.sandbox_id})
        assert list(metrics.json()["sandboxes"]) == [sandbox.sandbox_id]
    finally:
        sandbox.kill()


def test_nodes_stand_apart_and_their_guests_reach_only_the_internet(cluster: Cluster) -> None:
    """Each node is a namespace of its own with its own address, registered at it; a guest
    reaches an internet host through two layers of rules but none of the cluster: not
    PostgreSQL, S3, any node's API or the host's other services on the bridge."""
    nodes = [m for m in cluster.state.members if m.role == "node"]
    spaces = {os.stat(f"/proc/{m.pid}/ns/net").st_ino for m in nodes}
    assert len(spaces) == len(nodes) and os.stat("/proc/self/ns/net").st_ino not in spaces
    assert {n["name"]: n["url"] for n in cluster.nodes().values()} == {m.name: m.url for m in nodes}
    assert len({m.address for m in nodes}) == len(nodes)
    network = cluster.state.network
    postgres, s3 = urlsplit(cluster.state.state_url), urlsplit(cluster.state.s3_endpoint)
    with lab(network.subnet) as around:
        closed = [
            f"tcp://{postgres.hostname}:{postgres.port}",
            f"tcp://{s3.hostname}:{s3.port}",
            f"tcp://{cluster.state.registry}",
            *(f"tcp://{m.address}:{m.port}" for m in nodes),
            f"tcp://{network.gateway}:{around.ports['host']}",
        ]
        for target in closed:  # all open to the host: the probe could find them
            host, port = target[6:].split(":")
            socket.create_connection((host, int(port)), timeout=3).close()
        internet = around.url("internet")
        sandbox = Sandbox.create()
        try:
            found = sandbox.commands.run(shlex.join(probe_command("python3", [internet, *closed])))
            assert reached(json.loads(found.stdout)) == {internet: "internet"}
        finally:
            sandbox.kill()


def test_the_console_through_the_control_url_opens_any_node_and_drains_one(
    cluster: Cluster, browser: Browser
) -> None:
    sandbox = Sandbox.create()
    node = cluster.node_of(sandbox.sandbox_id)
    try:
        with signed_in(browser, cluster.url, cluster.state.api_key) as (page, watched):
            row = page.locator(f'[data-sandbox="{sandbox.sandbox_id}"]')
            expect(row).to_contain_text(node)
            # Its terminal, relayed by the control plane to its node.
            row.get_by_role("link").click()
            run_in_terminal(page, "echo relayed-$((6 * 7))", "relayed-42")
            # Every node's operations, summed by the control plane.
            page.get_by_role("link", name="Metrics").click()
            expect(page.locator('[data-operation="create"]')).to_be_visible(timeout=15_000)

            page.get_by_role("link", name="Nodes").click()
            listed = page.locator(f'[data-node="{node}"]')
            listed.get_by_role("button", name="Drain").click()
            expect(listed.locator(".node-state")).to_have_text("draining")
            assert cluster.nodes()[node]["state"] == "draining"
            listed.get_by_role("button", name="Activate").click()
            expect(listed.locator(".node-state")).to_have_text("active")
            assert watched.problems == [], watched.problems
    finally:
        cluster.api.post(f"/nodes/{node}/activate")
        sandbox.kill()


def test_a_drained_nodes_paused_sandbox_moves_on_resume(cluster: Cluster) -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.commands.run("echo moved > ~/state && " + TICKER)
        _pause_stored(cluster, sandbox.sandbox_id)
        node = cluster.node_of(sandbox.sandbox_id)
        assert cluster.api.post(f"/nodes/{node}/drain").status_code == 204
        try:
            resumed = Sandbox.connect(sandbox.sandbox_id)
            assert cluster.node_of(sandbox.sandbox_id) != node
            assert resumed.commands.run("cat ~/state").stdout == "moved\n"
            assert ticks(resumed) is not None
        finally:
            assert cluster.api.post(f"/nodes/{node}/activate").status_code == 204
    finally:
        sandbox.kill()


def _pause_stored(cluster: Cluster, sandbox_id: str) -> None:
    """Pause, answered once the state is in the object store (`waitStored`)."""
    paused = cluster.api.post(f"/sandboxes/{sandbox_id}/pause", json={"waitStored": True})
    assert paused.status_code == 204, paused.text
    assert cluster.api.get(f"/sandboxes/{sandbox_id}").json()["storage"] == "stored"


def test_a_lost_nodes_paused_sandbox_resumes_elsewhere(cluster: Cluster) -> None:
    """SIGKILL the node of a paused sandbox (stored) and a running one: after the timeout
    the paused one resumes on another node with its processes and disk; the running one
    is gone (a 404 saying it was lost with its node, and listed as lost), never a
    hanging request."""
    paused = Sandbox.create()
    paused.commands.run("echo disk > ~/state && " + TICKER)
    node = cluster.node_of(paused.sandbox_id)
    running = _create_on(cluster, node)
    _pause_stored(cluster, paused.sandbox_id)
    os.kill(cluster.pid(node), signal.SIGKILL)
    deadline = time.monotonic() + NODE_TIMEOUT + 15
    while cluster.nodes()[node]["state"] != "lost":
        assert time.monotonic() < deadline, "the node was never declared lost"
        time.sleep(0.5)
    answer = cluster.api.get(f"/sandboxes/{running.sandbox_id}", timeout=10)
    assert answer.status_code == 404, answer.text
    # Not a bare "not found": the loss, its node and why, for users and operators.
    assert f"was lost with node '{node}'" in answer.json()["message"]
    assert "it was running" in answer.json()["message"]
    (lost,) = [s for s in cluster.api.get("/lost-sandboxes").json()
               if s["sandboxID"] == running.sandbox_id]  # fmt: skip
    assert (lost["node"], lost["state"]) == (node, "running")
    resumed = Sandbox.connect(paused.sandbox_id)
    try:
        assert cluster.node_of(paused.sandbox_id) != node
        assert resumed.commands.run("cat ~/state").stdout == "disk\n"
        assert ticks(resumed) is not None
    finally:
        resumed.kill()


def test_down_leaves_nothing_behind(cluster: Cluster) -> None:
    """Runs last: everything `up` started stops, sandboxes included."""
    Sandbox.create()
    homes = [m.home for m in cluster.state.members if m.role == "node"]
    cluster.local.down()
    for member in cluster.state.members:
        assert not _alive(member.pid), member.name
    qemu = subprocess.run(["pgrep", "-af", "qemu-system"], capture_output=True, text=True).stdout
    assert not any(home in qemu for home in homes), qemu
    netns = subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout
    network = cluster.state.network
    nodes = [m for m in cluster.state.members if m.role == "node"]
    prefixes = [network.node_prefix(m.index) for m in nodes]
    assert not any(line.startswith(f"{p}-") for p in prefixes for line in netns.splitlines())
    assert not any(network.netns(m.index) in netns for m in nodes), netns
    assert not link_exists(network.bridge)
    for table in ("filter", "nat"):
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True)
        assert f"AC{network.tag.upper()}-" not in rules.stdout
    mounts = Path("/proc/mounts").read_text()
    assert str(cluster.local.directory) not in mounts
    assert all(row["state"] == "down" for row in cluster.local.status())
    with pytest.raises(httpx.HTTPError):
        httpx.get(cluster.url + "/health", timeout=2)


def _create_on(cluster: Cluster, node: str) -> Sandbox:
    """A sandbox that landed on `node` (placement spreads, so a few tries)."""
    others = []
    try:
        for _ in range(8):
            sandbox = Sandbox.create()
            if cluster.node_of(sandbox.sandbox_id) == node:
                return sandbox
            others.append(sandbox)
        raise AssertionError(f"no sandbox landed on {node}")
    finally:
        for other in others:
            other.kill()


def _environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never became healthy")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
