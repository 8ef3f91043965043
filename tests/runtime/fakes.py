"""Fakes of the runtime's dependencies (VMM driver, guest agent, network, catalog) and a
manager built on them, so lifecycle failure paths run as fast unit tests."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentenv.config import Config
from agentenv.guest.client import CONNECT_TIMEOUT
from agentenv.guest.kit import Kit
from agentenv.images.catalog import Template
from agentenv.net.hollow import HollowNamespaces
from agentenv.runtime.machine.host import MachineHost
from agentenv.runtime.sandboxes.creation import CreateRequest, SandboxCreations
from agentenv.runtime.sandboxes.manager import SandboxManager
from agentenv.runtime.snapshots import persist as persist_module
from agentenv.runtime.snapshots.pause import SandboxPauses
from agentenv.state.sandboxes import SqlSandboxStore
from agentenv.storage.filelayer import load_chain, materialize
from agentenv.storage.objectstore import ObjectStore
from agentenv.storage.posix import PosixObjectStore
from agentenv.vmm.driver import VmHandle, VmSpec
from agentenv.vmm.hollow import HollowDriver


class FakeDriver(HollowDriver):
    """A hollow driver whose `fail[op]` makes an operation raise, `gate[op]` holds it."""

    name = "fake"
    version = "fake 1"

    def __init__(self) -> None:
        super().__init__()
        self.fail: dict[str, Exception] = {}
        self.gate: dict[str, asyncio.Event] = {}
        # Set once an operation has reached its step (and waits at its gate, if any).
        self.reached: dict[str, asyncio.Event] = {}

    async def _step(self, op: str) -> None:
        self.reached.setdefault(op, asyncio.Event()).set()
        if op in self.gate:
            await self.gate[op].wait()
        if op in self.fail:
            raise self.fail[op]

    async def held_at(self, op: str) -> None:
        """Until an operation has reached `op`."""
        await self.reached.setdefault(op, asyncio.Event()).wait()


@dataclass
class FakeAgent:
    healthy_answer: bool = True
    init_error: Exception | None = None
    inits: list[dict[str, Any]] = field(default_factory=list)
    idle_seconds: float = 0.0
    reclaims: int = 0

    async def healthy(self, answer_within: float = CONNECT_TIMEOUT) -> bool:
        return self.healthy_answer

    async def init(self, env_vars: dict[str, str], token: str | None, **_: Any) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits.append(env_vars)

    async def sync(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    async def metrics(self) -> dict[str, Any]:
        return {"idle_seconds": self.idle_seconds, "mem_used": 40 << 20}

    async def reclaim(self) -> int:
        self.reclaims += 1
        return 0


class FakeCatalog:
    def __init__(self, rootfs: Path) -> None:
        self.rootfs = rootfs

    def resolve(self, name: str) -> Template:
        return Template(template_id=name, alias=None, rootfs=self.rootfs, rootfs_format="raw")


class MaterializedRam:
    """Serves a RAM layer as a whole file written once, where the node's block daemon
    would serve it page by page."""

    def __init__(self, store: ObjectStore, root: Path) -> None:
        self.store = store
        self.root = root

    def serve(self, layer_id: str) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / layer_id
        if not path.exists():
            materialize(load_chain(self.store, layer_id), self.store, path)
        return path


@dataclass
class Harness:
    manager: SandboxManager
    pauses: SandboxPauses
    driver: FakeDriver
    agent: FakeAgent
    namespaces: HollowNamespaces

    @property
    def networks(self) -> set[str]:
        """The namespaces made and not yet destroyed."""
        return set(self.namespaces.made)

    async def create(self) -> str:
        creations = SandboxCreations(self.manager)
        record = await creations.create(CreateRequest(template_id="base", timeout=60))
        return record.sandbox_id

    async def state(self, sandbox_id: str) -> str | None:
        record = await self.manager.store.get(sandbox_id)
        return None if record is None else record.state.value


async def make_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Harness:
    cfg = Config()
    cfg.paths.home = str(tmp_path / "home")
    cfg.sandbox.boot_snapshots = False
    cfg.sandbox.memory_mb = 256
    monkeypatch.setattr(persist_module, "set_backing", lambda *_: None)
    rootfs = tmp_path / "rootfs.ext4"
    rootfs.write_bytes(b"\0" * 4096)
    kit = Kit(tmp_path / "vmlinuz", tmp_path / "initrd", tmp_path / "runtime.ext4", "kit1")
    store = await SqlSandboxStore.open(cfg.state_url, "node-1")
    driver, namespaces = FakeDriver(), HollowNamespaces()
    host = MachineHost(driver, namespaces)
    manager = SandboxManager(cfg, store, host, kit, FakeCatalog(rootfs))  # type: ignore[arg-type]
    agent = FakeAgent()
    monkeypatch.setattr(manager.machines, "agent", lambda record: agent)

    real_start = manager.machines.launcher.start

    async def start(spec: VmSpec, agent_: Any, restorable: bool) -> VmHandle:
        handle = await real_start(spec, agent_, restorable)
        (spec.workdir / "memory").write_bytes(b"ram")
        return handle

    monkeypatch.setattr(manager.machines.launcher, "start", start)
    objects = PosixObjectStore(tmp_path / "objects")
    ram = MaterializedRam(objects, tmp_path / "served-ram")
    return Harness(manager, SandboxPauses(manager, objects, ram), driver, agent, namespaces)
