"""Per-sandbox network: a namespace with the guest's tap, joined to the host by a veth pair.

Every guest has the same address (clones of one snapshot are identical). The host reaches
a guest through the namespace's end of the veth, which DNATs to the guest; egress from the
guest is SNATed to that address and masqueraded on the host's default route. What the guest
may reach is decided in `policy`.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from .plan import GATEWAY_MAC, TAP_NAME, NetworkError, NetworkPlan, plan_network
from .policy import EgressPolicy, host_chains, namespace_rules

# The runtime and tools import these from here.
__all__ = [
    "TAP_NAME",
    "NetworkError",
    "NetworkPlan",
    "apply_policy",
    "create_detached_tap",
    "create_network",
    "destroy_network",
    "ensure_host_forwarding",
    "list_namespaces",
    "plan_network",
]

_NETNS_DIR = Path("/run/netns")


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


async def ensure_host_forwarding(host_subnet: str, name_prefix: str) -> None:
    """Install this server's host chains (forwarding, masquerading, isolation); idempotent."""
    forwarding = Path("/proc/sys/net/ipv4/ip_forward")
    # Set only when off: in a container /proc/sys may be read-only, and set already.
    if forwarding.read_text().strip() != "1":
        forwarding.write_text("1\n")
    for chain in host_chains(name_prefix, host_subnet):
        try:
            await _run("iptables", "-t", chain.table, "-N", chain.name)
        except NetworkError:
            await _run("iptables", "-t", chain.table, "-F", chain.name)
        for rule in chain.rules:
            await _run("iptables", "-t", chain.table, "-A", chain.name, *rule)
        try:
            await _run("iptables", "-t", chain.table, "-C", chain.parent, "-j", chain.name)
        except NetworkError:
            await _run("iptables", "-t", chain.table, "-I", chain.parent, "-j", chain.name)


def remove_host_forwarding(host_subnet: str, name_prefix: str) -> None:
    """Blocking: undo `ensure_host_forwarding` for one server (jumps, rules, chains), for
    a server that is gone for good; what is already gone is skipped."""
    for chain in host_chains(name_prefix, host_subnet):
        for args in (
            ["-D", chain.parent, "-j", chain.name],
            ["-F", chain.name],
            ["-X", chain.name],
        ):
            subprocess.run(["iptables", "-t", chain.table, *args], capture_output=True, check=False)


def _namespace_sysctls() -> list[str]:
    settings = ["net.ipv4.ip_forward=1"]
    if Path("/proc/sys/net/ipv6").exists():
        # No IPv6 in the namespace, not even link-local to the tap: the guest has no path
        # the IPv4 rules do not see.
        settings += ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
    return settings


async def apply_policy(
    plan: NetworkPlan, allow_internet: bool, egress: EgressPolicy | None = None
) -> None:
    """Set what the guest may reach, replacing the namespace's rules whole; idempotent.
    Without `egress` the guest gets no exception: no allowed range, no DNS."""
    nsenter = ("nsenter", f"--net={_NETNS_DIR / plan.netns}", "--")
    await _run(*nsenter, "sysctl", "-qw", *_namespace_sysctls())
    rules = namespace_rules(plan, allow_internet, egress or EgressPolicy())
    await _run(*nsenter, "iptables-restore", stdin=rules.encode())


async def create_network(
    plan: NetworkPlan, allow_internet: bool, egress: EgressPolicy | None = None
) -> None:
    """Create namespace, veth pair, tap and rules (see `apply_policy`); on failure nothing is
    left behind."""
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
        await apply_policy(plan, allow_internet, egress)
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


def namespace_exists(netns: str) -> bool:
    return (_NETNS_DIR / netns).exists()


def list_namespaces(name_prefix: str) -> list[str]:
    """Namespaces a server with this prefix created (for the start-up sweep of leftovers)."""
    if not _NETNS_DIR.exists():
        return []
    return sorted(p.name for p in _NETNS_DIR.iterdir() if p.name.startswith(f"{name_prefix}-"))
