"""What a guest may open connections to: its namespace's rules and this server's host chains.

A guest reaches the internet and nothing else: not the host, not another sandbox, not its
own namespace, and no private, link-local or reserved range unless the operator allows it.
The host keeps reaching every guest; replies to its connections always pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network

from ..config import ConfigError, NetConfig
from .dns import host_dns_server
from .plan import TAP_NAME, NetworkPlan
from .rules import EgressRules

log = logging.getLogger(__name__)

# Private (RFC 1918), shared carrier-grade NAT, loopback, link-local (cloud metadata lives
# there), "this network", IETF protocol assignments, benchmarking (used inside some
# networks), multicast and reserved (holding the broadcast address). The documentation
# ranges stay reachable: nothing private lives there, and labs use them as public stand-ins.
BLOCKED_RANGES = tuple(
    IPv4Network(cidr)
    for cidr in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
)

# Refused rather than dropped, so a guest's attempt fails at once instead of timing out:
# TCP gets a reset, since the kernel rate-limits the ICMP errors other protocols get.
_REFUSE = "REFUSE"
_REFUSE_CHAIN = [
    f":{_REFUSE} - [0:0]",
    f"-A {_REFUSE} -p tcp -j REJECT --reject-with tcp-reset",
    f"-A {_REFUSE} -j REJECT --reject-with icmp-admin-prohibited",
]


# NFSv3 and its MOUNT protocol, where guests mount volumes (`volumes/nfs.py`); Linux's
# NFS server and the guest agent use the same.
NFS_PORT = 2049
MOUNT_PORT = 20048
NFS_PORTS = f"{NFS_PORT},{MOUNT_PORT}"

# The node's policy for what a guest's own rules let through.
_NODE = "NODE-POLICY"
# Where a sandbox tunnelling its egress (`net/tunnels.py`) has the node's listener, inside
# its namespace, at its gateway.
TUNNEL_PORT = 1080


@dataclass(frozen=True)
class EgressPorts:
    """Where the node's egress proxy listens for guests' connections to ports 80 (HTTP)
    and 443 (TLS) (`net/egressproxy.py`)."""

    http: int
    tls: int


@dataclass(frozen=True)
class EgressPolicy:
    """The operator's exceptions: ranges guests may reach, and where their DNS queries go;
    and where the node's egress proxy listens, once it does."""

    allowed_ranges: tuple[IPv4Network, ...] = ()
    dns_server: IPv4Address | None = None
    proxy: EgressPorts | None = None
    # The node's NFS server for volumes (`volumes/nfs.py`), opened to sandboxes that mount.
    nfs_server: IPv4Address | None = None


def egress_policy(net: NetConfig) -> EgressPolicy:
    """The policy `net` configures; an empty `dns_server` means the host's own resolver."""
    ranges = []
    for cidr in filter(None, (part.strip() for part in net.allowed_ranges.split(","))):
        try:
            ranges.append(IPv4Network(cidr))
        except ValueError as exc:
            raise ConfigError(f"net.allowed_ranges: {cidr!r}: {exc}") from exc
    if net.dns_server:
        try:
            dns_server: IPv4Address | None = IPv4Address(net.dns_server)
        except ValueError as exc:
            raise ConfigError(f"net.dns_server: {exc}") from exc
    else:
        dns_server = host_dns_server()
        if dns_server is None:
            log.warning("no IPv4 resolver in the host's resolv.conf: guests get no DNS")
    return EgressPolicy(tuple(ranges), dns_server)


def namespace_rules(
    plan: NetworkPlan, rules: EgressRules, egress: EgressPolicy, *, mounts_volumes: bool = False
) -> str:
    """iptables-restore input for a sandbox's namespace, where the guest cannot change it:
    the node's policy first, then the sandbox's own rules within it."""
    from_guest = f"-i {TAP_NAME}"
    nat = [
        f"-A PREROUTING -i {plan.ns_veth} -d {plan.ns_ip} -j DNAT --to-destination {plan.guest_ip}",
        f"-A POSTROUTING -o {plan.ns_veth} -s {plan.guest_ip} -j SNAT --to-source {plan.ns_ip}",
    ]
    forward = [
        # Nothing in the namespace serves the guest: gateway and veth addresses are closed.
        f"-A INPUT {from_guest} -j {_REFUSE}",
        # A forged source could pass the guest's packets off as another sandbox's.
        f"-A FORWARD {from_guest} ! -s {plan.guest_ip} -j DROP",
        f"-A FORWARD {from_guest} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
    ]
    if mounts_volumes and egress.nfs_server is not None:
        # Its volumes, at its gateway's NFS port, whatever its egress rules say.
        nat.append(
            f"-A PREROUTING {from_guest} -d {plan.guest_gateway} -p tcp -m multiport"
            f" --dports {NFS_PORTS} -j DNAT --to-destination {egress.nfs_server}"
        )
        forward.append(
            f"-A FORWARD {from_guest} -p tcp -d {egress.nfs_server} -m multiport"
            f" --dports {NFS_PORTS} -m conntrack --ctstate DNAT --ctorigdst"
            f" {plan.guest_gateway} -j ACCEPT"
        )
    if not rules.internet and not rules.allow and not rules.domains:
        # Nothing at all, DNS included.
        forward.append(f"-A FORWARD {from_guest} -j {_REFUSE}")
    else:
        if egress.dns_server is not None:
            # The guest's resolver is its gateway; queries go on to the configured server.
            for proto in ("udp", "tcp"):
                nat.append(
                    f"-A PREROUTING {from_guest} -d {plan.guest_gateway} -p {proto} --dport 53"
                    f" -j DNAT --to-destination {egress.dns_server}"
                )
            forward.append(
                f"-A FORWARD {from_guest} -m conntrack --ctstate DNAT"
                f" --ctorigdst {plan.guest_gateway} -j ACCEPT"
            )
        if rules.upstream is not None:
            # All of its TCP to the node's listener in its namespace, which knows each
            # connection's destination.
            nat.append(
                f"-A PREROUTING {from_guest} -p tcp"
                f" -j DNAT --to-destination {plan.guest_gateway}:{TUNNEL_PORT}"
            )
            forward.insert(
                0,
                f"-A INPUT {from_guest} -p tcp -d {plan.guest_gateway} --dport {TUNNEL_PORT}"
                " -m conntrack --ctstate DNAT -j ACCEPT",
            )
        elif (rules.domains or rules.transforms) and egress.proxy is not None:
            nat += _to_egress_proxy(plan, rules, egress.proxy)
            ports = f"{egress.proxy.http},{egress.proxy.tls}"
            forward.append(
                f"-A FORWARD {from_guest} -p tcp -d {plan.host_ip} -m multiport --dports {ports}"
                " -m conntrack --ctstate DNAT -j ACCEPT"
            )
        # This server's sandboxes and host-side addresses stay closed whatever is allowed.
        forward.append(f"-A FORWARD {from_guest} -d {plan.host_subnet} -j {_REFUSE}")
        # The sandbox's own rules, an allowed range winning over a denied one; what they
        # allow, and what they leave alone, still goes through the node's policy.
        forward += [f"-A FORWARD {from_guest} -d {cidr} -j {_NODE}" for cidr in rules.allow]
        if rules.domains:
            # E2B's `dnsServers`: a domain allow-list opens its DNS servers, all traffic.
            forward += [
                f"-A FORWARD {from_guest} -d {server} -j {_NODE}" for server in rules.dns_servers
            ]
        forward += [f"-A FORWARD {from_guest} -d {cidr} -j {_REFUSE}" for cidr in rules.denied]
        forward.append(f"-A FORWARD {from_guest} -j {_NODE}")
    node_chain = [
        f":{_NODE} - [0:0]",
        *(f"-A {_NODE} -d {cidr} -j ACCEPT" for cidr in egress.allowed_ranges),
        *(f"-A {_NODE} -d {cidr} -j {_REFUSE}" for cidr in BLOCKED_RANGES),
        f"-A {_NODE} -j ACCEPT",
    ]
    filter_table = ["*filter", *_REFUSE_CHAIN, *node_chain, *forward, "COMMIT"]
    return "\n".join(["*nat", *nat, "COMMIT", *filter_table]) + "\n"


def _to_egress_proxy(plan: NetworkPlan, rules: EgressRules, ports: EgressPorts) -> list[str]:
    """nat rules sending the guest's new connections to the node's egress proxy (at the
    host's end of its veth), but for those its allowed ranges cover: HTTP and TLS to match
    allowed domains, TLS alone for header rules (which HTTPS requests alone get)."""
    lines = []
    intercepted = [(443, ports.tls)] if not rules.domains else [(80, ports.http), (443, ports.tls)]
    for port, proxy_port in intercepted:
        to_port = f"-A PREROUTING -i {TAP_NAME} -p tcp --dport {port}"
        if not (port == 443 and rules.transforms):  # the rules' hosts may be anywhere
            lines += [f"{to_port} -d {cidr} -j RETURN" for cidr in rules.allow]
        lines.append(f"{to_port} -j DNAT --to-destination {plan.host_ip}:{proxy_port}")
    return lines


def nfs_link_name(name_prefix: str) -> str:
    """The host's end of the NFS namespace's veth; outside `name_prefix+`, which names
    sandboxes' veths."""
    return f"nfs{name_prefix}"


@dataclass(frozen=True)
class HostChain:
    """One of this server's chains on the host, jumped to first from a built-in chain."""

    table: str
    name: str
    parent: str
    rules: tuple[tuple[str, ...], ...]


def host_chains(
    name_prefix: str, host_subnet: str, proxy: EgressPorts | None = None
) -> tuple[HostChain, ...]:
    """Defence behind the namespaces' rules: sandboxes open nothing on the host or each
    other, but the egress proxy's ports."""
    tag = name_prefix.upper()
    veths = f"{name_prefix}+"
    replies = ("-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT")
    to_proxy: tuple[tuple[str, ...], ...] = ()
    if proxy is not None:
        ports = f"{proxy.http},{proxy.tls}"
        to_proxy = (
            ("-i", veths, "-p", "tcp", "-m", "multiport", "--dports", ports, "-j", "ACCEPT"),
        )
    return (
        HostChain("filter", f"{tag}-INPUT", "INPUT", (
            # Replies to the host's own connections to its guests (API, proxy) pass.
            ("-i", veths, *replies),
            *to_proxy,
            ("-i", veths, "-j", "DROP"),
        )),
        HostChain("filter", f"{tag}-FORWARD", "FORWARD", (
            ("-i", veths, "-o", veths, "-j", "DROP"),
            ("-i", veths, "-j", "ACCEPT"),
            # The node's NFS server answers its sandboxes (whose own rules decide), no one else.
            ("-o", nfs_link_name(name_prefix), "-j", "DROP"),
            ("-o", veths, *replies),
            # Only the host itself opens connections to guests, not its network neighbours.
            ("-o", veths, "-j", "DROP"),
        )),
        HostChain("nat", f"{tag}-POSTROUTING", "POSTROUTING", (
            ("-s", host_subnet, "!", "-d", host_subnet, "-j", "MASQUERADE"),
        )),
    )  # fmt: skip
