"""The node's NFSv3 server for volumes mounted into sandboxes: nfs-ganesha in network and
mount namespaces of its own.

ganesha does not start without an rpcbind to register with. In its own namespaces that
rpcbind is private: no port 111 on the host, no clash with a host's own NFS server. The
server is reachable only by sandboxes whose namespace rules open it (`net/policy.py`), and
each volume is exported only to the namespace addresses of the sandboxes that mount it.
NFSv3 keeps no client state, so exports reload, and the server restarts, under mounted
guests: a hard mount waits and carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..errors import Unavailable
from ..net.netns import create_service_namespace, destroy_network, namespace_pids
from ..net.plan import nfs_addresses
from ..net.policy import MOUNT_PORT, NFS_PORT, NFS_PORTS, nfs_link_name

log = logging.getLogger(__name__)

GANESHA = "ganesha.nfsd"
_READY_TIMEOUT = 30.0
_RELOADED = "Reread exports complete"
# Run in the namespace by `ip netns exec`, which gives it a mount namespace of its own:
# a private /run for rpcbind's socket and ganesha's pid file, then ganesha in place of sh.
_LAUNCH = """
mount -t tmpfs -o mode=0755 aenv-nfs /run || exit 1
mkdir -p /run/rpcbind && chown _rpc /run/rpcbind 2>/dev/null
rpcbind -f &
i=0
while [ ! -S /run/rpcbind.sock ] && [ "$i" -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
exec "$0" -F -f "$1" -L "$2" -p /run/ganesha.pid -N NIV_EVENT
"""


class NfsError(Unavailable):
    """The NFS server could not be started or given its exports."""


@dataclass(frozen=True)
class NfsExport:
    """One volume, exported read-write to the namespace addresses of its sandboxes."""

    export_id: int
    volume_id: str
    directory: Path
    clients: tuple[str, ...]


def ganesha_config(address: str, exports: Iterable[NfsExport]) -> str:
    """ganesha's configuration: NFSv3 and MOUNT over TCP on `address`, nothing else (no
    NLM, quotas, UDP or NFSv4), and an export per volume at `/<volume id>`."""
    lines = [
        "NFS_CORE_PARAM {",
        "    Protocols = 3;",
        f"    NFS_Port = {NFS_PORT};",
        f"    MNT_Port = {MOUNT_PORT};",
        "    Enable_NLM = false;",
        "    Enable_RQUOTA = false;",
        "    Enable_UDP = false;",
        f"    Bind_addr = {address};",
        # Guests mount `/<volume id>`, never learning where the volume lives on the node.
        "    Mount_Path_Pseudo = true;",
        "}",
        "NFSV4 { Graceless = true; }",
        "NFS_KRB5 { Active_krb5 = false; }",
        "EXPORT_DEFAULTS { Access_Type = None; Protocols = 3; Transports = TCP; }",
    ]
    for export in exports:
        if not export.clients:
            continue
        lines += [
            "EXPORT {",
            f"    Export_Id = {export.export_id};",
            f'    Path = "{export.directory}";',
            f'    Pseudo = "/{export.volume_id}";',
            "    Protocols = 3;",
            "    Transports = TCP;",
            "    Access_Type = None;",
            # The guest's root owns what it makes, as on a local disk (the content API
            # then reads only regular files of it).
            "    Squash = No_Root_Squash;",
            "    SecType = sys;",
            "    Disable_ACL = true;",
            "    FSAL { Name = VFS; }",
            "    CLIENT {",
            f"        Clients = {', '.join(export.clients)};",
            "        Access_Type = RW;",
            "        Protocols = 3;",
            "    }",
            "}",
        ]
    return "\n".join(lines) + "\n"


def _namespace_rules(host_subnet: str) -> str:
    """The server's namespace takes NFS from the node's sandboxes only (rpcbind stays on
    loopback)."""
    return "\n".join(
        [
            "*filter",
            ":INPUT DROP [0:0]",
            "-A INPUT -i lo -j ACCEPT",
            "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
            f"-A INPUT -s {host_subnet} -p tcp -m multiport --dports {NFS_PORTS} -j ACCEPT",
            "COMMIT",
            "",
        ]
    )


class NfsServer:
    """This node's ganesha: started with its first export, reloaded on every change."""

    def __init__(self, cfg: Config) -> None:
        self.netns = f"{cfg.net.name_prefix}nfs"
        self.host_veth = nfs_link_name(cfg.net.name_prefix)
        self.host_subnet = cfg.net.host_subnet
        self.host_ip, self.address = nfs_addresses(cfg.net.host_subnet)
        self.directory = cfg.home / "nfs"
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    @property
    def config_file(self) -> Path:
        return self.directory / "ganesha.conf"

    @property
    def log_file(self) -> Path:
        return self.directory / "ganesha.log"

    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def publish(self, exports: list[NfsExport]) -> None:
        """Serve exactly `exports` (starting the server for the first); returns once the
        server has them."""
        async with self._lock:
            if not self.running() and not any(e.clients for e in exports):
                return
            await asyncio.to_thread(self._write_config, exports)
            if self.running():
                await self._reload()
            else:
                await self._start()

    def _write_config(self, exports: list[NfsExport]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        staged = self.config_file.with_suffix(".tmp")
        staged.write_text(ganesha_config(self.address, exports))
        os.replace(staged, self.config_file)

    async def _start(self) -> None:
        if shutil.which(GANESHA) is None:
            raise NfsError(f"volume mounts need {GANESHA} (Debian's nfs-ganesha-vfs)")
        await self.stop()
        await create_service_namespace(
            self.netns, self.host_veth, self.host_ip, self.address,
            _namespace_rules(self.host_subnet),
        )  # fmt: skip
        self.log_file.write_bytes(b"")
        self._process = await asyncio.create_subprocess_exec(
            "ip", "netns", "exec", self.netns, "sh", "-c", _LAUNCH, GANESHA,
            str(self.config_file), str(self.log_file),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            # Its own session: a signal meant for the server does not reach it.
            start_new_session=True,
        )  # fmt: skip
        try:
            await self._wait_ready()
        except BaseException:
            await self.stop()
            raise
        log.info("NFS server for volumes at %s:%d", self.address, NFS_PORT)

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if not self.running():
                raise NfsError(f"{GANESHA} exited at start: {self._log_tail()}")
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection(self.address, NFS_PORT)
                writer.close()
                return
            await asyncio.sleep(0.1)
        raise NfsError(f"{GANESHA} did not listen within {_READY_TIMEOUT:.0f}s: {self._log_tail()}")

    async def _reload(self) -> None:
        """SIGHUP, then wait for ganesha to say it has read its exports again."""
        assert self._process is not None
        before = self._log_text().count(_RELOADED)
        self._process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + _READY_TIMEOUT
        while self._log_text().count(_RELOADED) <= before:
            if not self.running() or time.monotonic() > deadline:
                raise NfsError(f"{GANESHA} did not reload its exports: {self._log_tail()}")
            await asyncio.sleep(0.05)

    def _log_text(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def _log_tail(self) -> str:
        lines = [
            line for line in self._log_text().splitlines() if ":CRIT :" in line or "FATAL" in line
        ]
        return " | ".join(lines[-3:]) or "no error logged"

    async def stop(self) -> None:
        """Stop the server, and one a crashed node left behind; idempotent."""
        for pid in await namespace_pids(self.netns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            await self._process.wait()
            self._process = None
        await destroy_network(self.netns, self.host_veth)
