"""Sandboxes' networks whose guest is a namespace: the rules of a real sandbox, no VM."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from agentenv.net.netns import create_network, destroy_network
from agentenv.net.plan import NetworkPlan, plan_network
from agentenv.net.policy import EgressPolicy
from agentenv.net.rules import EgressRules

from ..netlab import guest_stand_in


def plan_for(network: tuple[str, str], slot: int) -> NetworkPlan:
    return plan_network(
        slot,
        f"s{slot}",
        name_prefix=network[0],
        host_subnet=network[1],
        guest_ip="169.254.0.21",
        guest_gateway="169.254.0.22",
        guest_prefix=30,
    )


OPEN = EgressRules()


@asynccontextmanager
async def sandbox(
    network: tuple[str, str],
    slot: int,
    *,
    rules: EgressRules = OPEN,
    egress: EgressPolicy | None = None,
) -> AsyncIterator[tuple[NetworkPlan, str]]:
    """A sandbox's network whose tap is replaced by a veth to a namespace at the guest's
    address: a guest without a VM. Yields the plan and that namespace."""
    plan = plan_for(network, slot)
    try:
        await create_network(plan, rules, egress)
        with guest_stand_in(plan) as guest:
            yield plan, guest
    finally:
        await destroy_network(plan.netns, plan.host_veth)
