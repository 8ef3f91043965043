from __future__ import annotations

import subprocess
from ipaddress import IPv4Address
from pathlib import Path

import pytest

from agentenv.net.netns import (
    NetworkError,
    apply_policy,
    create_network,
    destroy_network,
    list_namespaces,
    plan_network,
)
from agentenv.net.policy import EgressPolicy
from agentenv.net.rules import EgressRules

PREFIX = "aenvu"


def _plan(slot: int, sandbox_id: str = "unit"):
    return plan_network(
        slot,
        sandbox_id,
        name_prefix=PREFIX,
        host_subnet="10.197.0.0/16",
        guest_ip="169.254.0.21",
        guest_gateway="169.254.0.22",
        guest_prefix=30,
    )


def test_plan_derives_everything_from_the_slot() -> None:
    plan = _plan(3)
    assert (plan.host_ip, plan.ns_ip) == ("10.197.0.13", "10.197.0.14")
    assert plan.netns == "aenvu-unit"
    assert plan.host_veth == "aenvu3h"
    assert len(plan.host_veth) <= 15
    with pytest.raises(NetworkError):
        _plan(16384)


async def test_create_and_destroy_leave_nothing_behind() -> None:
    plan = _plan(1, "realnet")
    await destroy_network(plan.netns, plan.host_veth)
    await create_network(plan, EgressRules(internet=False))
    try:
        assert plan.netns in list_namespaces(PREFIX)
        assert Path(f"/sys/class/net/{plan.host_veth}").exists()
        links = subprocess.run(
            ["ip", "-n", plan.netns, "-o", "link"], capture_output=True, text=True, check=True
        ).stdout
        assert "tap0" in links
        rules = subprocess.run(
            ["nsenter", f"--net=/run/netns/{plan.netns}", "--", "iptables-save"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"--to-destination {plan.guest_ip}" in rules
        assert "-A FORWARD -i tap0" in rules
        addrs = subprocess.run(
            ["ip", "-n", plan.netns, "-o", "addr"], capture_output=True, text=True, check=True
        ).stdout
        assert f"{plan.ns_ip}/30" in addrs
        # No IPv6 at all in the namespace, so the guest has no path the IPv4 rules miss.
        assert "inet6" not in addrs
    finally:
        await destroy_network(plan.netns, plan.host_veth)
    assert plan.netns not in list_namespaces(PREFIX)
    assert not Path(f"/sys/class/net/{plan.host_veth}").exists()


async def test_failed_create_cleans_up() -> None:
    plan = _plan(2, "clash")
    await destroy_network(plan.netns, plan.host_veth)
    # An interface already holding the veth name makes the batch fail half-way.
    subprocess.run(
        ["ip", "link", "add", plan.host_veth, "type", "veth", "peer", "name", "aenvu2x"], check=True
    )
    try:
        with pytest.raises(NetworkError):
            await create_network(plan, EgressRules())
        assert plan.netns not in list_namespaces(PREFIX)
    finally:
        subprocess.run(["ip", "link", "del", plan.host_veth], check=False)


def _namespace_rules(netns: str) -> str:
    return subprocess.run(
        ["nsenter", f"--net=/run/netns/{netns}", "--", "iptables-save"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


async def test_apply_policy_replaces_the_rules_whole() -> None:
    """What recovery can use on a namespace made under an older policy."""
    plan = _plan(4, "reapply")
    await destroy_network(plan.netns, plan.host_veth)
    await create_network(plan, EgressRules(internet=False))
    try:
        closed = _namespace_rules(plan.netns)
        assert "-A FORWARD -i tap0 -j REFUSE" in closed
        await apply_policy(plan, EgressRules(), EgressPolicy(dns_server=IPv4Address("10.0.0.2")))
        await apply_policy(plan, EgressRules(), EgressPolicy(dns_server=IPv4Address("10.0.0.3")))
        opened = _namespace_rules(plan.netns)
        assert "-A FORWARD -i tap0 -j REFUSE" not in opened
        assert "--to-destination 10.0.0.3" in opened
        assert "10.0.0.2" not in opened
        assert opened.count(":REFUSE") == 1
        assert opened.count("--to-destination 169.254.0.21") == 1
    finally:
        await destroy_network(plan.netns, plan.host_veth)
