"""Per-sandbox network: a namespace with the guest's tap, joined to the host by a veth pair.

Every guest has the same address (clones of one snapshot are identical). The host reaches
a guest through the namespace's end of the veth, which DNATs to the guest; egress from the
guest is SNATed to that address and masqueraded on the host's default route.
"""

from __future__ import annotations

import asyncio
import ipaddress
from dataclasses import dataclass
from pathlib import Path

TAP_NAME = "tap0"
GATEWAY_MAC = "02:fc:00:00:00:01"
_NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """Setting up or tearing down a sandbox network failed."""


@dataclass(frozen=True)
class NetworkPlan:
    """Names and addresses of one sandbox's network, derived from its slot alone."""

    slot: int
    netns: str
    host_veth: str
    ns_veth: str
    host_ip: str
    ns_ip: str
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
    """Slot k owns the k-th /30 of `host_subnet`: .1 on the host, .2 in the namespace."""
    subnet = ipaddress.ip_network(host_subnet)
    if not 0 <= slot < subnet.num_addresses // 4:
        raise NetworkError(f"network slot {slot} outside {host_subnet}")
    base = subnet.network_address + 4 * slot
    return NetworkPlan(
        slot=slot,
        netns=f"{name_prefix}-{sandbox_id}",
        host_veth=f"{name_prefix}{slot}h",
        ns_veth=f"{name_prefix}{slot}n",
        host_ip=str(base + 1),
        ns_ip=str(base + 2),
        guest_ip=guest_ip,
        guest_gateway=guest_gateway,
        guest_prefix=guest_prefix,
    )


async def _run(*args: str, stdin: bytes | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin)
    if proc.returncode != 0:
        raise NetworkError(f"{' '.join(args[:4])}: {err.decode(errors='replace').strip()}")
    return out.decode()


def _namespace_rules(plan: NetworkPlan, allow_internet: bool) -> str:
    lines = [
        "*nat",
        f"-A PREROUTING -i {plan.ns_veth} -d {plan.ns_ip} -j DNAT --to-destination {plan.guest_ip}",
        f"-A POSTROUTING -o {plan.ns_veth} -s {plan.guest_ip} -j SNAT --to-source {plan.ns_ip}",
        "COMMIT",
        "*filter",
    ]
    if not allow_internet:
        # Replies to connections the host opened still pass; the guest opens none itself.
        lines.append(
            f"-A FORWARD -i {TAP_NAME} -m conntrack ! --ctstate ESTABLISHED,RELATED -j DROP"
        )
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


async def ensure_host_forwarding(host_subnet: str, name_prefix: str) -> None:
    """Enable forwarding and masquerading for this server's sandboxes; idempotent."""
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    tag = name_prefix.upper()
    veths = f"{name_prefix}+"
    for table, chain, parent, rules in (
        ("filter", f"{tag}-FORWARD", "FORWARD", [
            ["-i", veths, "-j", "ACCEPT"],
            ["-o", veths, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
        ]),
        ("nat", f"{tag}-POSTROUTING", "POSTROUTING", [
            ["-s", host_subnet, "!", "-d", host_subnet, "-j", "MASQUERADE"],
        ]),
    ):  # fmt: skip
        try:
            await _run("iptables", "-t", table, "-N", chain)
        except NetworkError:
            await _run("iptables", "-t", table, "-F", chain)
        for rule in rules:
            await _run("iptables", "-t", table, "-A", chain, *rule)
        try:
            await _run("iptables", "-t", table, "-C", parent, "-j", chain)
        except NetworkError:
            await _run("iptables", "-t", table, "-I", parent, "-j", chain)


async def create_network(plan: NetworkPlan, allow_internet: bool) -> None:
    """Create namespace, veth pair, tap and NAT rules; on failure nothing is left behind."""
    await _run("ip", "netns", "add", plan.netns)
    try:
        host_side = "\n".join(
            [
                f"link add {plan.host_veth} type veth peer name {plan.ns_veth} netns {plan.netns}",
                f"addr add {plan.host_ip}/30 dev {plan.host_veth}",
                f"link set {plan.host_veth} up",
            ]
        )
        ns_side = "\n".join(
            [
                "link set lo up",
                f"addr add {plan.ns_ip}/30 dev {plan.ns_veth}",
                f"link set {plan.ns_veth} up",
                f"route add default via {plan.host_ip}",
                f"tuntap add {TAP_NAME} mode tap",
                # Fixed, so a guest restored from a snapshot finds its gateway's MAC unchanged.
                f"link set {TAP_NAME} address {GATEWAY_MAC}",
                f"addr add {plan.guest_gateway}/{plan.guest_prefix} dev {TAP_NAME}",
                f"link set {TAP_NAME} up",
            ]
        )
        await _run("ip", "-batch", "-", stdin=host_side.encode())
        await _run("ip", "-n", plan.netns, "-batch", "-", stdin=ns_side.encode())
        nsenter = ("nsenter", f"--net={_NETNS_DIR / plan.netns}", "--")
        await _run(*nsenter, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        await _run(
            *nsenter, "iptables-restore", stdin=_namespace_rules(plan, allow_internet).encode()
        )
    except BaseException:
        await destroy_network(plan.netns, plan.host_veth)
        raise


async def create_detached_tap(netns: str) -> None:
    """A namespace holding only an up `tap0`: a NIC like a sandbox's, connected to nothing."""
    await _run("ip", "netns", "add", netns)
    try:
        batch = f"tuntap add {TAP_NAME} mode tap\nlink set {TAP_NAME} address {GATEWAY_MAC}\n"
        batch += f"link set {TAP_NAME} up"
        await _run("ip", "-n", netns, "-batch", "-", stdin=batch.encode())
    except BaseException:
        await destroy_network(netns)
        raise


async def destroy_network(netns: str, host_veth: str | None = None) -> None:
    """Delete the namespace (and with it the tap, the veth pair and its rules); idempotent."""
    if (_NETNS_DIR / netns).exists():
        await _run("ip", "netns", "del", netns)
    if host_veth and Path(f"/sys/class/net/{host_veth}").exists():
        try:
            await _run("ip", "link", "del", host_veth)
        except NetworkError:
            # Deleting the namespace removes the pair asynchronously; gone is what we want.
            if Path(f"/sys/class/net/{host_veth}").exists():
                raise


def list_namespaces(name_prefix: str) -> list[str]:
    """Namespaces a server with this prefix created (for the start-up sweep of leftovers)."""
    if not _NETNS_DIR.exists():
        return []
    return sorted(p.name for p in _NETNS_DIR.iterdir() if p.name.startswith(f"{name_prefix}-"))
