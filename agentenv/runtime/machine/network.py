"""Sandboxes' networks on this node: each namespace's plan, making it, and its rules (the
node's egress policy with the sandbox's own `network` option in front) applied."""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Any

from ...config import Config
from ...net.namespaces import Namespaces
from ...net.netns import NetworkError, NetworkPlan, plan_network
from ...net.policy import egress_policy
from ...net.rules import EgressRules, egress_of
from ...state.sandboxes import SandboxRecord
from ...volumes.nfs import NfsError
from .cleanup import CleanupStack

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ...net.tunnels import EgressTunnels
    from .mounts import VolumeExports


def egress_rules(record: SandboxRecord) -> EgressRules:
    return egress_of(record.network, record.allow_internet)


def traffic_token_for(network: dict[str, Any]) -> str | None:
    """A token for the sandbox's ports when E2B's `allowPublicTraffic` is false."""
    return None if network.get("allowPublicTraffic", True) else secrets.token_urlsafe(24)


class SandboxNetworks:
    """Namespaces of this node's sandboxes, by network slot."""

    def __init__(self, cfg: Config, namespaces: Namespaces) -> None:
        self.cfg = cfg
        self.namespaces = namespaces
        # Built here so a bad `net.allowed_ranges` stops the server at start; the node adds
        # its egress proxy's ports before any namespace is made.
        self.egress = egress_policy(cfg.net)
        # The node's NFS exports, once the node has its volumes (`runtime/node/assembly.py`).
        self.exports: VolumeExports | None = None
        # The node's egress CA (PEM), which its guests trust, once the node has one.
        self.trusted_ca: str | None = None
        # Listeners of sandboxes tunnelling their egress, once the node has its egress proxy.
        self.tunnels: EgressTunnels | None = None

    def plan_for_slot(self, slot: int, sandbox_id: str = "-") -> NetworkPlan:
        net = self.cfg.net
        return plan_network(
            slot, sandbox_id, name_prefix=net.name_prefix, host_subnet=net.host_subnet,
            guest_ip=net.guest_ip, guest_gateway=net.guest_gateway, guest_prefix=net.guest_prefix,
        )  # fmt: skip

    def plan(self, record: SandboxRecord) -> NetworkPlan:
        return self.plan_for_slot(record.slot, record.sandbox_id)

    def slot_busy(self, slot: int) -> bool:
        """Whether the slot's interfaces still exist (a sandbox moving away may hold them)."""
        return self.namespaces.link_exists(self.plan_for_slot(slot).host_veth)

    def exists(self, record: SandboxRecord) -> bool:
        return self.namespaces.exists(self.plan(record).netns)

    async def make(self, record: SandboxRecord, cleanup: CleanupStack) -> None:
        """Its namespace (undone by `cleanup`) and, if it mounts volumes, their exports."""
        await self._create(record, cleanup)

    async def apply(self, record: SandboxRecord) -> None:
        """Today's rules for a sandbox whose namespace is here (none: nothing to do)."""
        if self.exists(record):
            await self._tunnel(record)
            await self.namespaces.apply(
                self.plan(record), egress_rules(record), self.egress,
                mounts_volumes=bool(record.volume_mounts),
            )  # fmt: skip
            await self._export(record)

    async def ensure(self, record: SandboxRecord) -> None:
        """The namespace of a sandbox that was paused on another node is made here."""
        if not self.exists(record):
            await self._create(record)
        else:
            await self._tunnel(record)

    async def _create(self, record: SandboxRecord, cleanup: CleanupStack | None = None) -> None:
        plan = self.plan(record)
        await self.namespaces.create(
            plan, egress_rules(record), self.egress, mounts_volumes=bool(record.volume_mounts)
        )
        if cleanup is not None:
            cleanup.push("network", lambda: self.namespaces.destroy(plan.netns, plan.host_veth))
        await self._tunnel(record)
        if cleanup is not None:
            cleanup.push("tunnel", lambda: self.stop_tunnel(record))
        await self._export(record)

    async def _tunnel(self, record: SandboxRecord) -> None:
        """Its egress tunnel's listener when its `egressProxy` asks for one; else none."""
        if self.tunnels is None:
            return
        if egress_rules(record).upstream is None:
            self.tunnels.close(record.sandbox_id)
        else:
            plan = self.plan(record)
            await self.tunnels.open(record.sandbox_id, plan.netns, plan.guest_gateway)

    async def stop_tunnel(self, record: SandboxRecord) -> None:
        """A sandbox that stopped running needs no listener (it would keep a deleted
        namespace alive); a resume opens one again."""
        if self.tunnels is not None:
            self.tunnels.close(record.sandbox_id)

    async def released(self, record: SandboxRecord) -> None:
        """A removed sandbox's volumes are no longer exported to its address (its slot is
        closed to the NFS server already: this tidies the export list)."""
        if not record.volume_mounts or self.exports is None:
            return
        try:
            await self.exports.publish()
        except (NfsError, NetworkError) as exc:
            log.warning("sandbox %s: volume exports not updated: %s", record.sandbox_id, exc)

    async def _export(self, record: SandboxRecord) -> None:
        """Its volumes are exported to it before its guest can mount them."""
        if record.volume_mounts and self.exports is not None:
            await self.exports.publish()
