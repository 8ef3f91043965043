"""Names and addresses of one sandbox's network, derived from its slot alone."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..errors import DependencyFailed

TAP_NAME = "tap0"
GATEWAY_MAC = "02:fc:00:00:00:01"


class NetworkError(DependencyFailed):
    """Setting up or tearing down a sandbox network failed. A client gets 503."""

    part = "the sandbox network"


@dataclass(frozen=True)
class NetworkPlan:
    """Names and addresses of one sandbox's network; `host_subnet` is the server's whole range."""

    slot: int
    netns: str
    host_veth: str
    ns_veth: str
    host_ip: str
    ns_ip: str
    host_subnet: str
    guest_ip: str
    guest_gateway: str
    guest_prefix: int


def plan_network(
    slot: int,
    sandbox_id: str,
    *,
    name_prefix: str,
    host_subnet: str,
    guest_ip: str,
    guest_gateway: str,
    guest_prefix: int,
) -> NetworkPlan:
    """Slot k owns the k-th /30 of `host_subnet`: .1 on the host, .2 in the namespace.
    The last /30 is the node's NFS server's (`nfs_addresses`)."""
    subnet = ipaddress.ip_network(host_subnet)
    if not 0 <= slot < subnet.num_addresses // 4 - 1:
        raise NetworkError(f"network slot {slot} outside {host_subnet}")
    base = subnet.network_address + 4 * slot
    return NetworkPlan(
        slot=slot,
        netns=f"{name_prefix}-{sandbox_id}",
        host_veth=f"{name_prefix}{slot}h",
        ns_veth=f"{name_prefix}{slot}n",
        host_ip=str(base + 1),
        ns_ip=str(base + 2),
        host_subnet=str(subnet),
        guest_ip=guest_ip,
        guest_gateway=guest_gateway,
        guest_prefix=guest_prefix,
    )


def nfs_addresses(host_subnet: str) -> tuple[str, str]:
    """The host's and the NFS server's address: the last /30 of `host_subnet`."""
    subnet = ipaddress.ip_network(host_subnet)
    base = subnet.network_address + subnet.num_addresses - 4
    return str(base + 1), str(base + 2)
