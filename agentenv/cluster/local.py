"""`aenv cluster up|status|down`: a whole cluster as processes on this host, for trying
and testing: Debian's PostgreSQL, an S3 server (moto), one control plane and N nodes,
each node in its own network namespace and address (`network.py`) with its own home,
network name prefix and subnet.

What it started is written to `DIR/cluster.json` (pids, ports, homes), so `status` and
`down` work from any shell; `down` kills the sandboxes, stops every process, removes the
nodes' host firewall chains and block daemons, and leaves only `DIR` (logs, data).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import boto3
import httpx

from ..config import Config, load_config
from ..guest.buildutil import locked
from ..net.netns import list_namespaces
from ..storage.blockd import BlockdClient
from ..volumes.nfs import NfsServer
from ..wire import API_KEY_HEADER
from .network import CHOICE_LOCK, ClusterNetwork
from .postgres import LocalPostgres, free_port
from .registry import registry_argv, wait_registry

STATE_FILE = "cluster.json"
BUCKET = "aenv"
S3_KEYS = {"access_key": "aenv", "secret_key": "aenv-local-cluster"}
_AENV = str(Path(sys.executable).with_name("aenv"))
_MOTO = str(Path(sys.executable).with_name("moto_server"))


class ClusterError(RuntimeError):
    """The cluster could not be brought up, inspected or taken down."""


@dataclass
class Member:
    """One process the cluster started."""

    name: str
    role: str  # control | node | hollow (a process of hollow nodes) | s3 | registry
    pid: int
    port: int
    log: str
    # Where it listens: a node on its own namespace's address, the rest on the host.
    address: str = "127.0.0.1"
    home: str = ""
    # A node's index on the cluster's bridge (its names and subnet derive from it); a
    # hollow process's first node's.
    index: int = 0
    # How many hollow nodes the process serves.
    nodes: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass
class ClusterState:
    api_key: str
    network: ClusterNetwork
    state_url: str = ""
    s3_endpoint: str = ""
    # `host:port` of the cluster's own OCI registry, when it runs one.
    registry: str = ""
    members: list[Member] = field(default_factory=list)

    @property
    def control(self) -> Member:
        return next(m for m in self.members if m.role == "control")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


class LocalCluster:
    """The cluster whose files live in `directory`."""

    def __init__(
        self, directory: Path, base: Config | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.directory = directory.resolve()
        # Kit and images are shared by every node: built once, where this host keeps them.
        self.base = base or load_config()
        # Settings every server of the cluster gets (AENV_* variables).
        self.env = dict(env or {})

    @property
    def _state_file(self) -> Path:
        return self.directory / STATE_FILE

    def load(self) -> ClusterState | None:
        try:
            doc = json.loads(self._state_file.read_text())
        except FileNotFoundError:
            return None
        members = [Member(**m) for m in doc.pop("members")]
        network = ClusterNetwork(**doc.pop("network"))
        return ClusterState(members=members, network=network, **doc)

    def _save(self, state: ClusterState) -> None:
        partial = self._state_file.with_suffix(".tmp")
        partial.write_text(json.dumps(asdict(state), indent=2))
        partial.chmod(0o600)  # it holds the API key
        partial.replace(self._state_file)

    # -- up ------------------------------------------------------------------------------

    def up(
        self, nodes: int, port: int | None = None, timeout: float = 180.0, registry: bool = False
    ) -> ClusterState:
        """Start everything and wait until the control plane sees every node; with
        `registry`, an OCI registry too, on the gateway, that the nodes pull from."""
        if nodes < 0:
            raise ClusterError("a number of nodes cannot be negative")
        existing = self.load()
        if existing is not None and any(_alive(m.pid) for m in existing.members):
            raise ClusterError(f"a cluster is already up in {self.directory}: take it down first")
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "logs").mkdir(exist_ok=True)
        ports = [free_port() for _ in range(3 if registry else 2)]
        with contextlib.ExitStack() as choosing:
            choosing.enter_context(locked(CHOICE_LOCK))
            state = ClusterState(
                api_key="e2b_" + secrets.token_hex(20), network=ClusterNetwork.choose()
            )
            self._save(state)
            try:
                state.network.create(open_ports=ports)
                choosing.close()  # the bridge holds the address: others may choose now
                postgres = LocalPostgres(self.directory / "postgres")
                state.state_url = postgres.start(ports[0], host=state.network.gateway)
                self._start_s3(state, ports[1])
                if registry:
                    self._start_registry(state, ports[2])
                for index in range(1, nodes + 1):
                    self._start_node(state, index)
                self._start_control(state, port or free_port())
                self._wait_ready(state, nodes, timeout)
            except BaseException:
                self._save(state)
                self.down()
                raise
        return state

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> tuple[int, str]:
        log = self.directory / "logs" / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives the shell that ran `cluster up`
            )
        return proc.pid, str(log)

    def _start_s3(self, state: ClusterState, port: int) -> None:
        if not Path(_MOTO).exists():
            raise ClusterError("moto_server not found: pip install 'moto[server]'")
        address = state.network.gateway
        argv = [_MOTO, "-H", address, "-p", str(port)]
        pid, log = self._spawn("s3", argv, dict(os.environ))
        member = Member("s3", "s3", pid, port, log, address)
        state.members.append(member)
        state.s3_endpoint = member.url
        self._save(state)
        deadline = time.monotonic() + 60
        while True:
            try:
                client = boto3.session.Session().client(
                    "s3",
                    endpoint_url=member.url,
                    region_name="us-east-1",
                    aws_access_key_id=S3_KEYS["access_key"],
                    aws_secret_access_key=S3_KEYS["secret_key"],
                )
                client.create_bucket(Bucket=BUCKET)
                return
            except Exception as exc:
                if time.monotonic() > deadline or not _alive(pid):
                    raise ClusterError(f"the S3 server did not start: {exc}") from exc
                time.sleep(0.3)

    def _start_registry(self, state: ClusterState, port: int) -> None:
        address = state.network.gateway
        argv = registry_argv(self.directory / "registry", address, port)
        pid, log = self._spawn("registry", argv, dict(os.environ))
        member = Member("registry", "registry", pid, port, log, address)
        state.members.append(member)
        state.registry = f"{address}:{port}"
        self._save(state)
        try:
            wait_registry(member.url, lambda: _alive(pid), 30)
        except RuntimeError as exc:
            raise ClusterError(f"{exc}: {Path(log).read_text(errors='replace')[-2000:]}") from exc

    def _common_env(self, state: ClusterState, port: int) -> dict[str, str]:
        # The cluster's registry speaks plain HTTP: its nodes allow that, besides what
        # the cluster's settings allow.
        insecure = ",".join(
            h for h in (self.env.get("AENV_REGISTRY_INSECURE"), state.registry) if h
        )
        return {
            **os.environ,
            "AENV_PORT": str(port),
            "AENV_API_KEY": state.api_key,
            "AENV_STATE_URL": state.state_url,
            "AENV_STORAGE_BACKEND": "s3",
            "AENV_STORAGE_S3_ENDPOINT": state.s3_endpoint,
            "AENV_STORAGE_S3_BUCKET": BUCKET,
            "AENV_STORAGE_S3_PATH_STYLE": "true",
            "AENV_STORAGE_S3_ACCESS_KEY": S3_KEYS["access_key"],
            "AENV_STORAGE_S3_SECRET_KEY": S3_KEYS["secret_key"],
            "AENV_PATHS_KIT_DIR": str(self.base.kit_dir),
            "AENV_PATHS_IMAGES_DIR": str(self.base.images_dir),
            # The file system every node shares for volumes, as a real cluster mounts one.
            "AENV_PATHS_VOLUMES_DIR": str(self.directory / "volumes"),
            **self.env,
            "AENV_REGISTRY_INSECURE": insecure,
        }

    def _start_node(self, state: ClusterState, index: int) -> None:
        """A node server inside its own network namespace (only that: it shares the
        host's mounts, so its block daemon's files and sandbox namespaces are seen by a
        restarted node and by `down`)."""
        name, port = f"node-{index}", free_port()
        home = self.directory / "nodes" / name
        home.mkdir(parents=True, exist_ok=True)
        member = Member(name, "node", 0, port, "", home=str(home), index=index)
        state.members.append(member)
        self._save(state)
        member.address = state.network.add_node(index)
        env = {
            **self._common_env(state, port),
            "AENV_HOME": str(home),
            "AENV_SERVER_ROLE": "node",
            "AENV_SERVER_NODE_NAME": name,
            "AENV_SERVER_HOST": member.address,
            "AENV_SERVER_ADVERTISE_URL": member.url,
            "AENV_NET_NAME_PREFIX": state.network.node_prefix(index),
            "AENV_NET_HOST_SUBNET": state.network.node_subnet(index),
        }
        netns = f"--net=/run/netns/{state.network.netns(index)}"
        member.pid, member.log = self._spawn(name, ["nsenter", netns, "--", _AENV, "server"], env)
        self._save(state)

    def _start_control(self, state: ClusterState, port: int) -> None:
        home = self.directory / "control"
        home.mkdir(exist_ok=True)
        env = {
            **self._common_env(state, port),
            "AENV_HOME": str(home),
            "AENV_SERVER_ROLE": "control",
        }
        pid, log = self._spawn("control", [_AENV, "server"], env)
        state.members.append(Member("control", "control", pid, port, log, home=str(home)))
        self._save(state)

    def add_hollow(
        self, count: int, env_overrides: dict[str, str] | None = None, timeout: float = 600.0
    ) -> Member:
        """`count` hollow nodes (`hollow.py`) in one more process, with settings of their
        own (`env_overrides`), once the control plane sees them: it must accept them
        (AENV_CLUSTER_ACCEPT_HOLLOW_NODES in the cluster's `env`)."""
        state = self.load()
        if state is None:
            raise ClusterError(f"no cluster is up in {self.directory}")
        first = 1 + max((m.index + m.nodes - 1 for m in state.members if m.nodes), default=0)
        home = self.directory / "hollow"
        env = {**self._common_env(state, 0), "AENV_HOME": str(home), "AENV_SERVER_ROLE": "node"}
        env |= env_overrides or {}
        argv = [sys.executable, "-m", "agentenv.cluster.hollow", "--first", str(first)]
        argv += ["--count", str(count), "--home", str(home)]
        name = f"hollow-{first:03d}+{count}"
        pid, log = self._spawn(name, argv, env)
        member = Member(name, "hollow", pid, 0, log, home=str(home), index=first, nodes=count)
        state.members.append(member)
        self._save(state)
        known = sum(m.nodes if m.role == "hollow" else m.role == "node" for m in state.members)
        self._wait_ready(state, known, timeout)
        return member

    def _wait_ready(self, state: ClusterState, nodes: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            dead = [m for m in state.members if not _alive(m.pid)]
            if dead:
                tail = Path(dead[0].log).read_text(errors="replace")[-2000:]
                raise ClusterError(f"{dead[0].name} exited while starting:\n{tail}")
            try:
                health = httpx.get(state.control.url + "/health", timeout=2).json()
                seen = health.get("nodes", 0)
                if seen >= nodes:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        raise ClusterError(f"only {seen} of {nodes} nodes came up within {timeout:.0f}s")

    # -- status and down -----------------------------------------------------------------

    def status(self) -> list[dict[str, Any]]:
        state = self.load()
        if state is None:
            return []
        rows = []
        for member in state.members:
            up = _alive(member.pid)
            if up and member.role in ("control", "node"):
                try:
                    up = httpx.get(member.url + "/health", timeout=2).status_code == 200
                except httpx.HTTPError:
                    up = False
            rows.append(
                {
                    "name": member.name,
                    "role": member.role,
                    "pid": member.pid,
                    "url": member.url,
                    "home": member.home,
                    "state": "up" if up else "down",
                }
            )
        return rows

    def down(self) -> None:
        """Stop what `up` started, sandboxes first; safe to repeat."""
        state = self.load()
        if state is not None:
            self._kill_sandboxes(state)
            # Control first (no new work), then nodes, then what they stand on.
            order = {"control": 0, "node": 1, "hollow": 1, "s3": 2, "registry": 2}
            for member in sorted(state.members, key=lambda m: order[m.role]):
                _stop(member.pid)
                if member.role == "node":
                    self._clean_node(member, state.network.node_prefix(member.index))
                    state.network.remove_node(member.index)
        LocalPostgres(self.directory / "postgres").stop()
        if state is not None:
            state.network.destroy()

    def _kill_sandboxes(self, state: ClusterState) -> None:
        headers = {API_KEY_HEADER: state.api_key}
        for member in state.members:
            if member.role != "node" or not _alive(member.pid):
                continue
            try:
                with httpx.Client(base_url=member.url, headers=headers, timeout=60) as api:
                    for sandbox in api.get("/v2/sandboxes").json():
                        api.delete(f"/sandboxes/{sandbox['sandboxID']}")
            except (httpx.HTTPError, ValueError, TypeError):
                continue  # its VMs go with the node's host resources below

    def _clean_node(self, member: Member, prefix: str) -> None:
        """What a stopped node leaves by design (VMs outlive their server, and so does the
        block daemon) goes too: this node is not coming back."""
        for pid in _vmms_under(member.home):
            _stop(pid, grace=5.0)
        for netns in list_namespaces(prefix):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
        env = {"AENV_HOME": member.home, "AENV_NET_NAME_PREFIX": prefix}
        cfg = load_config(env=env)
        BlockdClient(cfg).stop()
        asyncio.run(NfsServer(cfg).stop())


def _vmms_under(home: str) -> list[int]:
    """Pids of the QEMU processes whose command line names a path under `home`."""
    found = []
    marker = (home.rstrip("/") + "/").encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qemu-system-x86_64") and any(marker in a for a in argv):
            found.append(int(entry.name))
    return found


def _stop(pid: int, grace: float = 30.0) -> None:
    if not _alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
