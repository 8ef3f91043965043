"""A real `aenv server` process for integration tests, and host resource accounting."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

from agentenv.cluster.postgres import free_port
from agentenv.config import load_config
from agentenv.guest.kit import load_kit
from agentenv.net.subnetclaim import SubnetTaken, claimed_subnet
from agentenv.runtime.machine.bootsnap import complete_snapshots
from agentenv.storage.blockd import BlockdClient
from agentenv.vmm.qemu import qemu_version_name, run_dir_for
from agentenv.volumes.nfs import NfsServer

if TYPE_CHECKING:
    import pytest

from .netlab import remove_host_chains

TEST_KEY = "e2b_" + "5" * 40
AENV = str(Path(sys.executable).with_name("aenv"))


# Where test servers claim their /16 (`net/subnetclaim.py`, in a directory of their own
# so the server's own claim on it succeeds): other workers skip it even before it shows
# on an interface.
NETWORK_CLAIMS = Path("/run/lock/aenv-test-networks")
_claimed: dict[str, contextlib.ExitStack] = {}


def _unique_network() -> tuple[str, str]:
    """A name prefix and a /16 no other server on this host uses (they may run at once)."""
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    for _ in range(100):
        octet = secrets.choice(range(100, 190))
        subnet = f"10.{octet}.0.0/16"
        if f" 10.{octet}." in used:
            continue
        claim = contextlib.ExitStack()
        try:
            claim.enter_context(claimed_subnet(subnet, NETWORK_CLAIMS))
        except SubnetTaken:
            continue
        _claimed[subnet] = claim
        return f"at{secrets.token_hex(2)}", subnet
    raise RuntimeError("no free 10.x.0.0/16 for a test server")


def _release_network(subnet: str) -> None:
    claim = _claimed.pop(subnet, None)
    if claim is not None:
        claim.close()


@dataclass
class LiveServer:
    """One server process with its own home; kit and images come from the shared cache."""

    home: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    network: tuple[str, str] = field(default_factory=_unique_network)

    @property
    def prefix(self) -> str:
        return self.network[0]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        cfg = load_config(env={k: v for k, v in os.environ.items() if k != "AENV_HOME"})
        return {
            **os.environ,
            "AENV_HOME": str(self.home),
            "AENV_PATHS_KIT_DIR": str(cfg.kit_dir),
            "AENV_PATHS_IMAGES_DIR": str(cfg.images_dir),
            "AENV_PORT": str(self.port),
            "AENV_API_KEY": TEST_KEY,
            "AENV_NET_NAME_PREFIX": self.network[0],
            "AENV_NET_HOST_SUBNET": self.network[1],
            "AENV_SANDBOX_MEMORY_MB": "256",
            # Its build takes minutes: only the code interpreter's tests turn it on.
            "AENV_SERVER_CODE_INTERPRETER": "false",
            # Builds of many tests share a server: its step cache stays small on CI's disk.
            "AENV_CACHE_BUILD_MAX_BYTES": str(2 * 2**30),
            **self.extra_env,
        }

    def start(self, timeout: float = 60.0) -> None:
        log = open(self.home / "server.log", "ab")
        self.proc = subprocess.Popen(
            [AENV, "server"], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server did not answer /health: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        """Kill what tests left, stop for good, and remove the server's host firewall chains."""
        try:
            if self.proc and self.proc.poll() is None:
                # VMs outlive the server by design; a failed test must not leave them running.
                with self.client(key=self.api_key) as api:
                    for sandbox_id in self.sandbox_ids():
                        api.delete(f"/sandboxes/{sandbox_id}")
        finally:
            self.stop()
            # The block daemon and the NFS server outlive a killed server by design; the
            # test's home goes, so must they.
            cfg = load_config(env=self.env)
            BlockdClient(cfg).stop()
            asyncio.run(NfsServer(cfg).stop())
            remove_host_chains(self.prefix, self.network[1])
            _release_network(self.network[1])
            # Its VMMs are gone: what is left in the run directory (kernel stubs, the RAM
            # library) would stay in /run for every test server.
            shutil.rmtree(run_dir_for(self.home), ignore_errors=True)

    def sandbox_ids(self) -> set[str]:
        """The sandboxes the server has, running or paused."""
        with self.client(key=self.api_key) as api:
            listed = api.get("/v2/sandboxes", params={"limit": 100})
        assert listed.status_code == 200, listed.text
        return {sandbox["sandboxID"] for sandbox in listed.json()}

    @property
    def api_key(self) -> str:
        """The key the server accepts: ours, or the one it generated when given none."""
        if self.env["AENV_API_KEY"]:
            return self.env["AENV_API_KEY"]
        return (self.home / "secrets" / "api-key").read_text().strip()

    def resources(self) -> HostResources:
        return HostResources.measure(self.home, self.prefix)

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return (self.home / "server.log").read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def client(self, key: str | None = TEST_KEY) -> httpx.Client:
        headers = {"X-API-Key": key} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=180)


@dataclass(frozen=True)
class HostResources:
    """What a sandbox can leak on the host, counted for one server's prefix and home."""

    vmms: int
    namespaces: int
    links: int
    workdirs: int
    mounts: int
    sockets: int
    checkpoints: int
    snapshots: int = 0
    # Processes other than VMMs and the node's own services (block daemon, NFS server)
    # that name the home or run in a sandbox's namespace.
    daemons: int = 0
    # Temporary files and directories the node makes in its home while it works.
    scratch: int = 0

    @classmethod
    def measure(cls, home: Path, prefix: str) -> HostResources:
        sandboxes = home / "sandboxes"
        vmms = sum(1 for _ in _pids_mentioning(str(sandboxes)))
        netns = Path("/run/netns")
        namespaces = (
            sum(1 for p in netns.iterdir() if p.name.startswith(prefix + "-"))
            if netns.exists()
            else 0
        )
        links = sum(1 for p in Path("/sys/class/net").iterdir() if p.name.startswith(prefix))
        workdirs = sum(1 for _ in sandboxes.iterdir()) if sandboxes.exists() else 0
        # The block daemon's one FUSE mount belongs to the server, not to a sandbox.
        daemon_mount = str(home / "blockd" / "mnt")
        mounts = sum(
            1
            for line in Path("/proc/mounts").read_text().splitlines()
            if str(home) in line and daemon_mount not in line
        )
        run_dir = run_dir_for(home)
        # Sandbox VMs' control sockets (a boot snapshot's VM has one too while it builds).
        sockets = sum(1 for _ in run_dir.glob("aenv-i*.qmp")) if run_dir.exists() else 0
        forks = home / "forks"
        checkpoints = sum(1 for _ in forks.iterdir()) if forks.exists() else 0
        # Snapshot files (`snapshots/<name>/<tag>`), staged ones included.
        snapshot_root = home / "snapshots"
        snapshots = sum(1 for _ in snapshot_root.glob("*/*")) if snapshot_root.exists() else 0
        daemons = len(_stray_processes(home, prefix))
        scratch = sum(1 for pattern in _SCRATCH for _ in home.glob(pattern))
        return cls(
            vmms, namespaces, links, workdirs, mounts, sockets, checkpoints, snapshots,
            daemons, scratch,
        )  # fmt: skip

    def transient(self) -> HostResources:
        """All but the snapshot files: those are data a test may keep (templates, build
        caches, named snapshots), the rest must go with the sandboxes that made them."""
        return dataclasses.replace(self, snapshots=0)

    def within(self, baseline: HostResources) -> bool:
        """Nothing beyond `baseline`, of any kind. Less is fine: the baseline can hold what an
        earlier test was still releasing when it was measured."""
        return all(
            getattr(self, f.name) <= getattr(baseline, f.name) for f in dataclasses.fields(self)
        )


# The node's scratch space: snapshots being staged, volume uploads being spooled, build
# contexts being received, chunks being fetched. Not the object store's: it is durable
# storage, and a write a crash cut short stays there, unlisted, by design.
_SCRATCH = ("snapshots/.staging/*", "volumes/.spool/*/*", ".upload-*", "cache/**/.tmp-*")


def _stray_processes(home: Path, prefix: str) -> list[int]:
    """Processes that name `home` or run in one of its sandboxes' namespaces, other than
    the sandboxes' VMMs, the block daemon and the NFS server (the node's services)."""
    netns = Path("/run/netns")
    named = list(netns.iterdir()) if netns.exists() else []
    sandbox_namespaces = {_inode(p) for p in named if p.name.startswith(prefix + "-")}
    service_namespaces = {_inode(p) for p in named if p.name == f"{prefix}nfs"}
    home_text, sandboxes = str(home).encode(), str(home / "sandboxes").encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            namespace = (proc / "ns" / "net").stat().st_ino
        except OSError:
            continue
        if sandboxes in cmdline or b"agentenv.storage.blockd" in cmdline:
            continue
        if namespace in service_namespaces:
            continue
        if home_text in cmdline or namespace in sandbox_namespaces:
            found.append(int(proc.name))
    return found


def _inode(path: Path) -> int | None:
    """The inode of `path`; None once it is gone (a namespace removed while counting)."""
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def _pids_mentioning(text: str) -> Iterator[int]:
    """Processes whose command line contains `text` (a VMM names its work directory)."""
    needle = text.encode()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    yield int(proc.name)
            except OSError:
                pass


def leftovers(server: LiveServer) -> list[str]:
    """Anything of a closed server still on the host: processes, namespaces, links,
    mounts, its run directory. Empty once `close` did its work."""
    home, prefix = str(server.home), server.prefix
    found = [f"process {pid}" for pid in _pids_mentioning(home)]
    netns = Path("/run/netns")
    if netns.exists():
        found += [f"namespace {p.name}" for p in netns.iterdir() if p.name.startswith(prefix)]
    host_links = (p.name for p in Path("/sys/class/net").iterdir())
    found += [f"link {name}" for name in host_links if name.startswith(prefix)]
    found += [f"link nfs{prefix}"] if Path(f"/sys/class/net/nfs{prefix}").exists() else []
    mounts = Path("/proc/mounts").read_text().splitlines()
    found += [f"mount {line.split()[1]}" for line in mounts if home in line]
    run_dir = run_dir_for(server.home)
    found += [f"run directory {run_dir}"] if run_dir.exists() else []
    return found


def sweep(server: LiveServer) -> None:
    """Remove what `leftovers` finds, so that one failed check does not burden the tests
    after it."""
    for pid in _pids_mentioning(str(server.home)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for line in Path("/proc/mounts").read_text().splitlines():
        if str(server.home) in line:
            subprocess.run(["umount", "-l", line.split()[1]], check=False)
    netns = Path("/run/netns")
    for namespace in netns.iterdir() if netns.exists() else ():
        if namespace.name.startswith(server.prefix):
            subprocess.run(["ip", "netns", "del", namespace.name], check=False)
    for link in Path("/sys/class/net").iterdir():
        if link.name.startswith(server.prefix) or link.name == f"nfs{server.prefix}":
            subprocess.run(["ip", "link", "del", link.name], check=False)
    shutil.rmtree(run_dir_for(server.home), ignore_errors=True)


def vmm_pid(server: LiveServer, sandbox_id: str) -> int | None:
    """The pid of the sandbox's VMM process, if it has one."""
    return next(_pids_mentioning(str(server.home / "sandboxes" / sandbox_id)), None)


class Configured(Protocol):
    """A server, or a cluster's node, known by the settings it was started with."""

    @property
    def env(self) -> Mapping[str, str]: ...


def boot_snapshot(server: Configured, memory_mb: int) -> Path | None:
    """The server's complete boot snapshot for guests of `memory_mb` and its configured
    vCPUs, if there is one (other tests make snapshots of other shapes beside it)."""
    cfg = load_config(env=server.env)
    kit = load_kit(cfg)
    assert kit is not None
    root = cfg.kit_dir / "boot-snapshots"
    found = complete_snapshots(root, kit.version, qemu_version_name(cfg.vmm.qemu_binary))
    shape = (cfg.sandbox.vcpus, memory_mb)
    matching = (p for p, meta in found.items() if (meta["vcpus"], meta["memory_mb"]) == shape)
    return next(matching, None)


def wait_for(predicate, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def point_sdk(env: pytest.MonkeyPatch, url: str, api_key: str = TEST_KEY) -> None:
    """Point the unmodified E2B SDKs at `url` with the three variables they read."""
    env.setenv("E2B_API_URL", url)
    env.setenv("E2B_SANDBOX_URL", url)
    env.setenv("E2B_API_KEY", api_key)


@contextlib.contextmanager
def checked_server(
    live: LiveServer, ready: Callable[[LiveServer], None] = lambda _: None
) -> Iterator[LiveServer]:
    """`live` started (and `ready`), closed on exit; it must leave nothing on the host."""
    live.start()
    try:
        ready(live)
        yield live
    finally:
        live.close()
    left = leftovers(live)
    sweep(live)
    assert not left, f"the server in {live.home} left {left}"
    # Its snapshots and caches take gigabytes; a server that left nothing needs no study.
    shutil.rmtree(live.home, ignore_errors=True)
