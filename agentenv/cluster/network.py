"""The local cluster's network: a host bridge its members meet on, and one network
namespace per node with its own address on that bridge.

Nodes reach PostgreSQL and S3, and the control plane reaches nodes, over addresses as they
would across machines, never through a shared loopback. Each node's sandboxes live in
namespaces of their own behind the node's, so a guest's packets cross two sets of rules;
the host lets nodes open only PostgreSQL and S3 on it, and forwards their egress out.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..net.netns import enable_forwarding, install_chains, link_exists, remove_chains
from ..net.policy import HostChain

NODE_INTERFACE = "eth0"
# Held by a cluster from choosing its bridge's subnet until the bridge holds the address:
# two clusters started at once on one host would otherwise both see the same one free.
CHOICE_LOCK = Path("/run/lock/aenv-cluster-subnet.lock")


class ClusterNetworkError(RuntimeError):
    """The bridge or a node's namespace could not be set up."""


def _ip(*args: str, stdin: str | None = None) -> None:
    done = subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True)
    if done.returncode != 0:
        raise ClusterNetworkError(f"ip {' '.join(args[:4])}: {done.stderr.strip()}")


def _free_subnet() -> str:
    used = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    for octet in range(200, 250):
        if f" 10.{octet}." not in used:
            return f"10.{octet}.0.0/24"
    raise ClusterNetworkError("no free 10.x.0.0/24 subnet for the cluster's bridge")


@dataclass(frozen=True)
class ClusterNetwork:
    """Names and addresses derive from `tag` and `subnet` alone, so `down` can undo them
    from what `cluster.json` recorded."""

    tag: str
    subnet: str

    @classmethod
    def choose(cls) -> ClusterNetwork:
        return cls(secrets.token_hex(2), _free_subnet())

    @property
    def bridge(self) -> str:
        return f"ac{self.tag}br"

    @property
    def gateway(self) -> str:
        """The host's address on the bridge, where PostgreSQL and S3 listen."""
        return str(ipaddress.ip_network(self.subnet)[1])

    def address(self, index: int) -> str:
        """Node `index`'s address (1 for the first node)."""
        return str(ipaddress.ip_network(self.subnet)[index + 1])

    def netns(self, index: int) -> str:
        return f"aenvc{self.tag}-node{index}"

    def node_prefix(self, index: int) -> str:
        """Node `index`'s sandbox name prefix: unique on the host (/run/netns is shared)."""
        return f"c{self.tag}{index}"

    @staticmethod
    def node_subnet(index: int) -> str:
        """Node `index`'s sandbox subnet, inside its own namespace: the host's routes and
        other nodes' subnets do not reach there, so it is fixed, not chosen."""
        return f"10.{120 + index}.0.0/16"

    def _veth(self, index: int) -> str:
        return f"ac{self.tag}n{index}"

    def _chains(self, open_ports: Sequence[int]) -> tuple[HostChain, ...]:
        bridge = ("-i", self.bridge)
        replies = ("-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
        ports = ",".join(str(p) for p in open_ports)
        tag = f"AC{self.tag.upper()}"
        return (
            HostChain("filter", f"{tag}-INPUT", "INPUT", (
                (*bridge, *replies),
                (*bridge, "-d", self.gateway, "-p", "tcp", "-m", "multiport",
                 "--dports", ports, "-j", "ACCEPT"),
                (*bridge, "-j", "DROP"),
            )),
            HostChain("filter", f"{tag}-FORWARD", "FORWARD", (
                (*bridge, "-j", "ACCEPT"),
                ("-o", self.bridge, *replies),
                ("-o", self.bridge, "-j", "DROP"),
            )),
            HostChain("nat", f"{tag}-POSTROUTING", "POSTROUTING", (
                ("-s", self.subnet, "!", "-d", self.subnet, "-j", "MASQUERADE"),
            )),
        )  # fmt: skip

    def create(self, open_ports: Sequence[int]) -> None:
        """The bridge with the host's address, and the host chains that let nodes open
        `open_ports` on the gateway and nothing else on the host."""
        prefix = ipaddress.ip_network(self.subnet).prefixlen
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        enable_forwarding()
        install_chains(self._chains(open_ports))

    def add_node(self, index: int) -> str:
        """Node `index`'s namespace, joined to the bridge; its address."""
        netns, veth = self.netns(index), self._veth(index)
        prefix = ipaddress.ip_network(self.subnet).prefixlen
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", netns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        inside = [
            "link set lo up",
            f"addr add {self.address(index)}/{prefix} dev {NODE_INTERFACE}",
            f"link set {NODE_INTERFACE} up",
            f"route add default via {self.gateway}",
        ]
        _ip("-n", netns, "-batch", "-", stdin="\n".join(inside) + "\n")
        return self.address(index)

    def remove_node(self, index: int) -> None:
        """Blocking, idempotent: the namespace (its rules go with it) and its veth pair."""
        subprocess.run(["ip", "netns", "del", self.netns(index)], capture_output=True)
        if link_exists(self._veth(index)):
            subprocess.run(["ip", "link", "del", self._veth(index)], capture_output=True)

    def destroy(self) -> None:
        """Blocking, idempotent: host chains and bridge."""
        remove_chains(self._chains(()))
        if link_exists(self.bridge):
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
