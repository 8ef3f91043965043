"""The hollow machine host's parts, each on its own: what a hollow node stands on."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentenv.config import Config
from agentenv.errors import Unavailable
from agentenv.guest.hollow import HollowAgent
from agentenv.net.hollow import HollowNamespaces
from agentenv.net.netns import plan_network
from agentenv.net.policy import EgressPolicy
from agentenv.net.rules import EgressRules
from agentenv.runtime.machine.host import MachineHost
from agentenv.storage.blockd.hollow import HollowBlockd
from agentenv.vmm.hollow import HollowDriver
from agentenv.vmm.qemuimg import qcow2_virtual_size


def test_the_hollow_block_daemon_serves_stacks_as_empty_files(tmp_path: Path) -> None:
    cfg = Config()
    cfg.paths.home = str(tmp_path)
    blockd = HollowBlockd(cfg)
    assert blockd.ensure_running() == 0
    path, size = blockd.mount("top", ["bottom", "top"])
    assert path.is_file() and size == 0
    # The collector keeps every layer of a served stack.
    assert blockd.status()["mounts"] == [{"name": "top", "layers": ["bottom", "top"]}]
    assert blockd.unmount("top") and not blockd.unmount("top")
    assert blockd.status()["mounts"] == []
    assert not blockd.paths.socket.exists()  # no daemon was started


async def test_hollow_namespaces_are_remembered_until_destroyed() -> None:
    namespaces = HollowNamespaces()
    plan = plan_network(
        3, "sbx", name_prefix="h001", host_subnet="127.199.0.0/16",
        guest_ip="169.254.0.21", guest_gateway="169.254.0.22", guest_prefix=30,
    )  # fmt: skip
    await namespaces.create(plan, EgressRules(), EgressPolicy(), mounts_volumes=False)
    assert namespaces.exists(plan.netns) and namespaces.link_exists(plan.host_veth)
    assert namespaces.listed("h001") == [plan.netns] and namespaces.listed("h002") == []
    await namespaces.destroy(plan.netns)
    assert not namespaces.exists(plan.netns) and not namespaces.link_exists(plan.host_veth)


async def test_a_hollow_guest_answers_the_host_and_runs_nothing(tmp_path: Path) -> None:
    agent = HollowAgent("http://127.199.0.2:49983", "token")
    assert await agent.healthy()
    await agent.init({"A": "1"}, "token")
    assert (await agent.metrics())["mem_used"] == 0
    with pytest.raises(Unavailable, match="no guest"):
        await agent.run(["true"])
    with pytest.raises(Unavailable, match="no guest"):
        await agent.write_file("/tmp/x", b"x")


async def test_a_hollow_disk_has_the_size_the_runtime_reads(tmp_path: Path) -> None:
    host = MachineHost.hollow()
    assert isinstance(host.driver, HollowDriver) and host.agents is HollowAgent
    disk = tmp_path / "rootfs.qcow2"
    await host.driver.create_disk(disk, 5 << 30, tmp_path / "base.ext4", "raw")
    assert qcow2_virtual_size(disk) == 5 << 30
