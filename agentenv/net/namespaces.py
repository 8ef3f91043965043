"""Sandboxes' network namespaces as the runtime sees them: one small interface, made by
`ip` and `iptables` on a real node (`LinuxNamespaces`), in memory on a hollow one."""

from __future__ import annotations

from typing import Protocol

from . import netns
from .plan import NetworkPlan
from .policy import EgressPolicy
from .rules import EgressRules


class Namespaces(Protocol):
    """Make, rule, find and remove sandboxes' namespaces."""

    async def create(
        self, plan: NetworkPlan, rules: EgressRules, egress: EgressPolicy, *, mounts_volumes: bool
    ) -> None:
        """The namespace, its links and its rules; on failure nothing is left behind."""
        ...

    async def apply(
        self, plan: NetworkPlan, rules: EgressRules, egress: EgressPolicy, *, mounts_volumes: bool
    ) -> None:
        """Replace the namespace's rules whole."""
        ...

    async def destroy(self, name: str, host_veth: str | None = None) -> None:
        """The namespace and its host link gone; idempotent."""
        ...

    def exists(self, name: str) -> bool: ...

    def link_exists(self, link: str) -> bool: ...

    def listed(self, name_prefix: str) -> list[str]:
        """Namespaces a server with this prefix made."""
        ...


class LinuxNamespaces:
    """The host's own namespaces (`net/netns.py`)."""

    async def create(
        self, plan: NetworkPlan, rules: EgressRules, egress: EgressPolicy, *, mounts_volumes: bool
    ) -> None:
        await netns.create_network(plan, rules, egress, mounts_volumes=mounts_volumes)

    async def apply(
        self, plan: NetworkPlan, rules: EgressRules, egress: EgressPolicy, *, mounts_volumes: bool
    ) -> None:
        await netns.apply_policy(plan, rules, egress, mounts_volumes=mounts_volumes)

    async def destroy(self, name: str, host_veth: str | None = None) -> None:
        await netns.destroy_network(name, host_veth)

    def exists(self, name: str) -> bool:
        return netns.namespace_exists(name)

    def link_exists(self, link: str) -> bool:
        return netns.link_exists(link)

    def listed(self, name_prefix: str) -> list[str]:
        return netns.list_namespaces(name_prefix)
