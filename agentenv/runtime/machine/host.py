"""What a node's machines stand on: its VMM, its network namespaces and its guests' agents.
A real node's are QEMU, Linux and HTTP; a hollow node's start nothing (tests, benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass

from ...guest.client import AgentClient
from ...guest.hollow import HollowAgent
from ...net.hollow import HollowNamespaces
from ...net.namespaces import LinuxNamespaces, Namespaces
from ...vmm.driver import VmmDriver
from ...vmm.hollow import HollowDriver


@dataclass(frozen=True)
class MachineHost:
    driver: VmmDriver
    namespaces: Namespaces
    # Made for one sandbox's guest: (base url, access token, init secret, reclaim delay).
    agents: type[AgentClient] = AgentClient

    @classmethod
    def linux(cls, driver: VmmDriver) -> MachineHost:
        return cls(driver, LinuxNamespaces())

    @classmethod
    def hollow(cls, driver: HollowDriver | None = None) -> MachineHost:
        """No guest, no interface, no process: every VM is a number in `driver`."""
        return cls(driver or HollowDriver(), HollowNamespaces(), HollowAgent)
