"""Namespaces of a hollow node (tests, benchmarks): names in a set, no interface made."""

from __future__ import annotations

from .plan import NetworkPlan
from .policy import EgressPolicy
from .rules import EgressRules


class HollowNamespaces:
    """`Namespaces` in memory: what was made is remembered until it is destroyed."""

    def __init__(self) -> None:
        # Namespace names, and the host links each one holds.
        self.made: dict[str, str] = {}

    async def create(
        self, plan: NetworkPlan, rules: EgressRules, egress: EgressPolicy, *, mounts_volumes: bool
    ) -> None:
        self.made[plan.netns] = plan.host_veth

    async def apply(
        self, plan: NetworkPlan, rules: EgressRules, egress: EgressPolicy, *, mounts_volumes: bool
    ) -> None:
        return None

    async def destroy(self, name: str, host_veth: str | None = None) -> None:
        self.made.pop(name, None)

    def exists(self, name: str) -> bool:
        return name in self.made

    def link_exists(self, link: str) -> bool:
        return link in self.made.values()

    def listed(self, name_prefix: str) -> list[str]:
        return sorted(n for n in self.made if n.startswith(f"{name_prefix}-"))
