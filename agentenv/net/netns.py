"""Per-sandbox network: a namespace with the guest's tap, joined to the host by a veth pair.

Every guest has the same address (clones of one snapshot are identical). The host reaches
a guest through the namespace's end of the veth, which DNATs to the guest; egress from the
guest is SNATed to that address and masqueraded on the host's default route. What the guest
may reach is decided in `policy`.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from collections.abc import Iterable
from pathlib import Path

from .plan import GATEWAY_MAC, TAP_NAME, NetworkError, NetworkPlan, plan_network
from .policy import EgressPolicy, EgressPorts, HostChain, host_chains, namespace_rules
from .rules import EgressRules

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
    "link_exists",
    "list_namespaces",
    "plan_network",
]

NETNS_DIR = Path("/run/netns")


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


def enable_forwarding() -> None:
    """Let this network namespace route between its interfaces."""
    forwarding = Path("/proc/sys/net/ipv4/ip_forward")
    # Set only when off: in a container /proc/sys may be read-only, and set already.
    if forwarding.read_text().strip() != "1":
        forwarding.write_text("1\n")


def _iptables(table: str, *args: str) -> bool:
    done = subprocess.run(["iptables", "-t", table, *args], capture_output=True, text=True)
    return done.returncode == 0


def install_chains(chains: Iterable[HostChain]) -> None:
    """Blocking: create or refill each chain and jump to it first from its parent;
    idempotent."""
    for chain in chains:
        if not _iptables(chain.table, "-N", chain.name):
            _iptables(chain.table, "-F", chain.name)
        for rule in chain.rules:
            if not _iptables(chain.table, "-A", chain.name, *rule):
                raise NetworkError(f"iptables: cannot add {' '.join(rule)} to {chain.name}")
        if not _iptables(chain.table, "-C", chain.parent, "-j", chain.name):
            if not _iptables(chain.table, "-I", chain.parent, "-j", chain.name):
                raise NetworkError(f"iptables: cannot jump from {chain.parent} to {chain.name}")


def remove_chains(chains: Iterable[HostChain]) -> None:
    """Blocking: undo `install_chains` (jumps, rules, chains); what is gone is skipped."""
    for chain in chains:
        _iptables(chain.table, "-D", chain.parent, "-j", chain.name)
        _iptables(chain.table, "-F", chain.name)
        _iptables(chain.table, "-X", chain.name)


async def ensure_host_forwarding(
    host_subnet: str, name_prefix: str, proxy: EgressPorts | None = None
) -> None:
    """Install this server's host chains (forwarding, masquerading, isolation, the egress
    proxy's ports); idempotent."""
    enable_forwarding()
    await asyncio.to_thread(install_chains, host_chains(name_prefix, host_subnet, proxy))


def remove_host_forwarding(host_subnet: str, name_prefix: str) -> None:
    """Blocking: undo `ensure_host_forwarding` for a server that is gone for good."""
    remove_chains(host_chains(name_prefix, host_subnet))


def link_exists(name: str) -> bool:
    """Whether this process's network namespace has an interface `name` (unlike
    /sys/class/net, right in a namespace entered without remounting /sys)."""
    try:
        socket.if_nametoindex(name)
    except OSError:
        return False
    return True


def _namespace_sysctls() -> list[str]:
    settings = ["net.ipv4.ip_forward=1"]
    if Path("/proc/sys/net/ipv6").exists():
        # No IPv6 in the namespace, not even link-local to the tap: the guest has no path
        # the IPv4 rules do not see.
        settings += ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
    return settings


async def apply_policy(
    plan: NetworkPlan,
    rules: EgressRules,
    egress: EgressPolicy | None = None,
    *,
    mounts_volumes: bool = False,
) -> None:
    """Set what the guest may reach, replacing the namespace's rules whole (atomically, so
    an update never leaves a gap); idempotent. Without `egress` the guest gets no
    exception: no allowed range, no DNS."""
    nsenter = ("nsenter", f"--net={NETNS_DIR / plan.netns}", "--")
    await _run(*nsenter, "sysctl", "-qw", *_namespace_sysctls())
    restore = namespace_rules(plan, rules, egress or EgressPolicy(), mounts_volumes=mounts_volumes)
    await _run(*nsenter, "iptables-restore", stdin=restore.encode())


async def create_network(
    plan: NetworkPlan,
    rules: EgressRules,
    egress: EgressPolicy | None = None,
    *,
    mounts_volumes: bool = False,
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
        await apply_policy(plan, rules, egress, mounts_volumes=mounts_volumes)
    except BaseException:
        await destroy_network(plan.netns, plan.host_veth)
        raise


async def create_service_namespace(
    netns: str, host_veth: str, host_ip: str, ns_ip: str, rules: str
) -> None:
    """A namespace for one of the node's own services, joined to the host by a /30 veth
    pair, its iptables-restore `rules` in place; on failure nothing is left behind."""
    await _run("ip", "netns", "add", netns)
    try:
        host_side = (
            f"link add {host_veth} type veth peer name svc0 netns {netns}\n"
            f"addr add {host_ip}/30 dev {host_veth}\nlink set {host_veth} up"
        )
        ns_side = (
            f"link set lo up\naddr add {ns_ip}/30 dev svc0\nlink set svc0 up\n"
            f"route add default via {host_ip}"
        )
        await _run("ip", "-batch", "-", stdin=host_side.encode())
        await _run("ip", "-n", netns, "-batch", "-", stdin=ns_side.encode())
        await _run("ip", "netns", "exec", netns, "iptables-restore", stdin=rules.encode())
    except BaseException:
        await destroy_network(netns, host_veth)
        raise


async def namespace_pids(netns: str) -> list[int]:
    """Processes living in `netns` (none if it is gone)."""
    if not namespace_exists(netns):
        return []
    return [int(pid) for pid in (await _run("ip", "netns", "pids", netns)).split()]


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
    """Delete the veth pair, then the namespace (and with it the tap and its rules);
    idempotent. The pair goes first: deleting it is done when `ip` returns, while a deleted
    namespace takes its interfaces down later, in the kernel's own time."""
    if host_veth and link_exists(host_veth):
        try:
            await _run("ip", "link", "del", host_veth)
        except NetworkError:
            # A namespace deleted earlier (a crash mid-teardown) may be taking it down.
            if link_exists(host_veth):
                raise
    if (NETNS_DIR / netns).exists():
        await _run("ip", "netns", "del", netns)


def namespace_exists(netns: str) -> bool:
    return (NETNS_DIR / netns).exists()


def list_namespaces(name_prefix: str) -> list[str]:
    """Namespaces a server with this prefix created (for the start-up sweep of leftovers)."""
    if not NETNS_DIR.exists():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{name_prefix}-"))
