"""Fakes of the runtime's dependencies (VMM driver, guest agent, network, catalog) and a
manager built on them, so lifecycle failure paths run as fast unit tests."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agentenv.config import Config
from agentenv.guest.kit import Kit
from agentenv.images.catalog import Template
from agentenv.runtime.machine import network as network_module
from agentenv.runtime.sandboxes import machines as machines_module
from agentenv.runtime.sandboxes import manager as manager_module
from agentenv.runtime.sandboxes.creation import CreateRequest, SandboxCreations
from agentenv.runtime.sandboxes.manager import SandboxManager
from agentenv.runtime.snapshots import persist as persist_module
from agentenv.runtime.snapshots.pause import SandboxPauses
from agentenv.state.sandboxes import SqlSandboxStore
from agentenv.storage.filelayer import load_chain, materialize
from agentenv.storage.objectstore import ObjectStore
from agentenv.storage.posix import PosixObjectStore
from agentenv.vmm.driver import BalloonStats, Launched, PreparedVm, VmHandle, VmSpec

VMSTATE, CONSUMED = "vmstate", "vmstate.consumed"


class FakeDriver:
    """VMs as pids in a set; `fail[op]` makes an operation raise, `gate[op]` holds it."""

    name = "fake"
    version = "fake 1"
    returns_free_pages = True

    def __init__(self) -> None:
        self.alive: dict[int, Path] = {}
        # Balloon targets by pid, as set.
        self.balloons: dict[int, int] = {}
        self.frozen: set[int] = set()
        self.fail: dict[str, Exception] = {}
        self.gate: dict[str, asyncio.Event] = {}
        # Set once an operation has reached its step (and waits at its gate, if any).
        self.reached: dict[str, asyncio.Event] = {}
        self._pids = itertools.count(1000)

    async def _step(self, op: str) -> None:
        self.reached.setdefault(op, asyncio.Event()).set()
        if op in self.gate:
            await self.gate[op].wait()
        if op in self.fail:
            raise self.fail[op]

    async def held_at(self, op: str) -> None:
        """Until an operation has reached `op`."""
        await self.reached.setdefault(op, asyncio.Event()).wait()

    def _handle(self, spec: VmSpec) -> VmHandle:
        pid = next(self._pids)
        self.alive[pid] = spec.workdir
        return VmHandle(driver=self.name, pid=pid, workdir=str(spec.workdir), accel="fake")

    async def boot(self, spec: VmSpec) -> VmHandle:
        await self._step("boot")
        return self._handle(spec)

    async def restore(
        self, spec: VmSpec, snapshot_dir: Path, launched: Launched | None = None
    ) -> VmHandle:
        return await self.finish_restore(await self.prepare_restore(spec, snapshot_dir), launched)

    async def prepare_restore(self, spec: VmSpec, snapshot_dir: Path) -> PreparedVm:
        in_place = not (snapshot_dir / "memory").exists()
        return PreparedVm(self._handle(spec), snapshot_dir, in_place)

    async def finish_restore(
        self, prepared: PreparedVm, launched: Launched | None = None
    ) -> VmHandle:
        handle, snapshot_dir = prepared.handle, prepared.snapshot_dir
        if launched is not None:
            await launched(handle)
        try:
            await self._step("load")  # the device state loads; the guest has not run
            if prepared.in_place:
                (snapshot_dir / VMSTATE).rename(snapshot_dir / CONSUMED)
            await self._step("restore")  # the guest runs
        except BaseException:
            await self.stop(handle)
            raise
        return handle

    async def stop(self, handle: VmHandle) -> None:
        self.alive.pop(handle.pid, None)
        self.frozen.discard(handle.pid)

    def is_alive(self, handle: VmHandle) -> bool:
        return handle.pid in self.alive

    def running_vms(self, root: Path) -> dict[Path, int]:
        return {workdir: pid for pid, workdir in self.alive.items() if workdir.parent == root}

    async def kill_pid(self, pid: int) -> None:
        self.alive.pop(pid, None)

    def reclaim_control_files(self) -> int:
        return 0

    async def pause(self, handle: VmHandle, snapshot_dir: Path) -> None:
        self.frozen.add(handle.pid)
        await self._step("pause")
        snapshot_dir.mkdir(parents=True, exist_ok=True)
        (snapshot_dir / VMSTATE).write_text("device state")

    async def freeze(self, handle: VmHandle) -> None:
        self.frozen.add(handle.pid)
        await self._step("freeze")

    async def resume(self, handle: VmHandle) -> None:
        self.frozen.discard(handle.pid)

    def saved_state_intact(self, snapshot_dir: Path) -> bool:
        return (snapshot_dir / VMSTATE).is_file()

    def trim_log(self, handle: VmHandle) -> None:
        return None

    async def set_balloon(self, handle: VmHandle, target_mb: int) -> None:
        self.balloons[handle.pid] = target_mb

    async def balloon(self, handle: VmHandle) -> BalloonStats:
        return BalloonStats(actual_mb=self.balloons.get(handle.pid, 0))


@dataclass
class FakeAgent:
    healthy_answer: bool = True
    init_error: Exception | None = None
    inits: list[dict[str, Any]] = field(default_factory=list)
    idle_seconds: float = 0.0
    reclaims: int = 0

    async def healthy(self) -> bool:
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
    networks: set[str]

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
    networks: set[str] = set()

    async def create_network(plan: Any, rules: Any, egress: Any = None, **_: Any) -> None:
        networks.add(plan.netns)

    async def destroy_network(netns: str, host_veth: str | None = None) -> None:
        networks.discard(netns)

    async def create_qcow2(path: Path, size: int | None = None, **__: Any) -> None:
        # Just the header's magic and virtual size, which the manager reads.
        path.write_bytes(b"QFI\xfb" + bytes(20) + (size or 1).to_bytes(8, "big"))

    monkeypatch.setattr(network_module, "create_network", create_network)
    monkeypatch.setattr(network_module, "destroy_network", destroy_network)
    monkeypatch.setattr(manager_module, "destroy_network", destroy_network)
    monkeypatch.setattr(network_module, "apply_policy", create_network)
    monkeypatch.setattr(machines_module, "create_qcow2", create_qcow2)
    monkeypatch.setattr(persist_module, "set_backing", lambda *_: None)
    rootfs = tmp_path / "rootfs.ext4"
    rootfs.write_bytes(b"\0" * 4096)
    kit = Kit(tmp_path / "vmlinuz", tmp_path / "initrd", tmp_path / "runtime.ext4", "kit1")
    store = await SqlSandboxStore.open(cfg.state_url, "node-1")
    driver = FakeDriver()
    manager = SandboxManager(cfg, store, driver, kit, FakeCatalog(rootfs))  # type: ignore[arg-type]
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
    return Harness(manager, SandboxPauses(manager, objects, ram), driver, agent, networks)
