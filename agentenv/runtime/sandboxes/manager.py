"""The sandboxes of one node: created, tracked and removed, each a VM in its own network.

Every change of a sandbox goes through `operate` (a create through `bring_up`, a kill
through `kill`): it takes the sandbox's
lock, moves it into the operation's transient state, runs the body and ends with DONE or
FAILED, each persisted before anything else happens. Nothing else looks at states: the
table in `lifecycle.py` decides what is allowed.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import secrets
import shutil
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import httpx

from ...config import Config
from ...crashpoints import crash_point
from ...errors import Conflict, InvalidInput, NotFound, Unavailable
from ...guest.client import AgentClient
from ...guest.kit import Kit, guest_args, load_kit
from ...guest.rpc import ConnectError
from ...images.catalog import Template, TemplateCatalog
from ...net.netns import destroy_network
from ...net.rules import EGRESS_FIELDS, EgressRules
from ...observe.metrics import timed
from ...state.lifecycle import Event, State, next_state
from ...state.sandboxes import SandboxRecord, SandboxStore
from ...vmm import guestram
from ...vmm.driver import VmHandle, VmmDriver, VmmError, VmSpec
from ...vmm.qemuimg import create_qcow2, qcow2_virtual_size
from ...wire import ENVD_PORT
from ..machine.bootsnap import (
    DISK_BYTES,
    BootSnapshots,
    Shape,
    read_init_secret,
    sandbox_vm,
    write_init_secret,
)
from ..machine.cleanup import CleanupStack
from ..machine.guestconfig import init_agent
from ..machine.launch import VmLauncher
from ..machine.network import SandboxNetworks, egress_rules, traffic_token_for
from ..memory.admission import Demand, admit, committed_by, demand_of, host_capacity
from ..memory.metricshistory import MetricsHistory

log = logging.getLogger(__name__)

# Pause modes, as E2B names them: memory and disk, or the disk alone.
FULL = "full"
FILESYSTEM = "filesystem"
_ID_ALPHABET = string.ascii_lowercase + string.digits
T = TypeVar("T")


@dataclass(frozen=True)
class Route:
    """Where the proxy sends a sandbox's traffic, and the token it must check."""

    host: str
    access_token: str | None
    # Requests to its own ports (not the agent's) must carry it; None: they are public.
    traffic_token: str | None = None
    # The Host header its own ports see (`${PORT}` is the port); None: as sent.
    mask_host: str | None = None
    # Its egress rules: the egress proxy reads its allowed domains.
    egress: EgressRules = field(default_factory=EgressRules)


class GuestLost(Unavailable):
    """A resumed guest ran but failed; its saved state no longer matches its memory."""


def guest_kernel_args(cfg: Config) -> str:
    """The same for every sandbox (each has its own namespace), so snapshots can be shared."""
    net = cfg.net
    # The gateway answers DNS: the namespace forwards it to the configured resolver.
    return guest_args(net.guest_ip, net.guest_prefix, net.guest_gateway, dns=net.guest_gateway)


def new_sandbox_id() -> str:
    return "i" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(19))


def now() -> datetime:
    return datetime.now(UTC)


class SandboxManager:
    """Owns every sandbox on this node."""

    def __init__(
        self,
        cfg: Config,
        store: SandboxStore,
        driver: VmmDriver,
        kit: Kit,
        catalog: TemplateCatalog,
        boot_snapshots: BootSnapshots | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.driver = driver
        self.kit = kit
        self.catalog = catalog
        self.launcher = VmLauncher(cfg.sandbox, driver, boot_snapshots)
        self.capacity = host_capacity(cfg.sandbox, cfg.home)
        self.networks = SandboxNetworks(cfg)
        # Admission reads what is committed and then commits more: one at a time.
        self._admission_lock = asyncio.Lock()
        self._locks: dict[str, asyncio.Lock] = {}
        self._operations: dict[str, asyncio.Task[Any]] = {}
        self._readers: dict[str, asyncio.Task[None]] = {}
        self._routes: dict[str, Route] = {}
        self.metrics_history = MetricsHistory()
        # Network slots held by VMs that are no sandbox yet (the warm pool's).
        self._held_slots: set[int] = set()

    # -- helpers ---------------------------------------------------------------------

    def lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def workdir(self, sandbox_id: str) -> Path:
        return self.cfg.sandboxes_dir / sandbox_id

    def forks_dir(self) -> Path:
        return self.cfg.home / "forks"

    def agent(self, record: SandboxRecord) -> AgentClient:
        return AgentClient(
            f"http://{self.networks.plan(record).ns_ip}:{ENVD_PORT}",
            record.access_token,
            init_secret=read_init_secret(self.workdir(record.sandbox_id)),
            reclaim_after_idle=self.cfg.sandbox.reclaim_after_idle,
        )

    async def _transition(self, record: SandboxRecord, event: Event) -> None:
        """Persist the next state; the proxy routes to a sandbox exactly while it runs."""
        record.state = next_state(record.state, event)
        changes: dict[str, Any] = {"state": record.state}
        if record.state == State.RUNNING and record.pause_mode is not None:
            # Running, it has no pause behind it: recovery must not read one into its files.
            record.pause_mode = changes["pause_mode"] = None
        await asyncio.shield(self.store.update(record.sandbox_id, **changes))
        if record.state == State.RUNNING:
            self.adopt(record)
        else:
            self._routes.pop(record.sandbox_id, None)

    async def _run_killable(self, sandbox_id: str, body: Awaitable[T]) -> T:
        """Run `body` as a task that `kill` may cancel; a kill surfaces as 409."""
        task = asyncio.ensure_future(body)
        self._operations[sandbox_id] = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise Conflict(f"sandbox '{sandbox_id}' was killed meanwhile") from None
        finally:
            self._operations.pop(sandbox_id, None)

    async def operate(
        self,
        sandbox_id: str,
        event: Event,
        body: Callable[[SandboxRecord], Awaitable[T]],
        admit_memory: bool = False,
    ) -> T:
        """Under the sandbox's lock: `event` into its transient state, `body`, then DONE,
        or FAILED (LOST for `GuestLost`) when the body fails or `kill` cancels it."""
        with timed(event.value):
            async with self.lock(sandbox_id):
                record = await self.get(sandbox_id)
                next_state(record.state, event)  # a refused event is 409, before admission
                await self._stop_reader(sandbox_id)
                if admit_memory:
                    async with self._admission_lock:
                        await self._admit(demand_of(record), exclude=sandbox_id)
                        await self._transition(record, event)
                else:
                    await self._transition(record, event)
                try:
                    result = await self._run_killable(sandbox_id, body(record))
                except BaseException as exc:
                    failed = Event.LOST if isinstance(exc, GuestLost) else Event.FAILED
                    await self._transition(record, failed)
                    if record.state == State.KILLING:
                        await asyncio.shield(self.teardown(record))
                    raise
                await self._transition(record, Event.DONE)
                return result

    def read_paused(self, sandbox_id: str, body: Awaitable[None]) -> asyncio.Task[None]:
        """Run `body`, which reads a paused sandbox's files, until the next operation on
        the sandbox: that cancels it first, so nothing reads files a guest changes."""
        task = asyncio.ensure_future(body)
        self._readers[sandbox_id] = task
        task.add_done_callback(lambda _: self._readers.pop(sandbox_id, None))
        return task

    async def set_lineage(
        self, sandbox_id: str, layers: dict[str, str], stored: bool = False
    ) -> None:
        """Record stored layers of a sandbox's files: `stored`, they are its paused files
        now; else only an ancestor of them, what its next upload is diffed against (kept
        off a sandbox whose paused files are stored, whose layers must stay theirs)."""
        async with self.lock(sandbox_id):
            record = await self.store.get(sandbox_id)
            if record is None or (record.stored and not stored):
                return
            await self.store.update(sandbox_id, layers=layers, stored=stored)

    async def _stop_reader(self, sandbox_id: str) -> None:
        reader = self._readers.get(sandbox_id)
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _admit(self, demand: Demand, exclude: str | None = None) -> None:
        records = [r for r in await self.store.list() if r.sandbox_id != exclude]
        committed = committed_by(records)
        await asyncio.to_thread(
            admit, demand, committed, self.capacity, self.cfg.sandbox, self.cfg.home
        )

    def clamp_timeout(self, timeout: int) -> int:
        if timeout < 0:
            raise InvalidInput("timeout must not be negative")
        return min(timeout, self.cfg.sandbox.max_timeout)

    # -- queries ---------------------------------------------------------------------

    async def get(self, sandbox_id: str) -> SandboxRecord:
        record = await self.store.get(sandbox_id)
        if record is None or record.state == State.KILLING:
            raise NotFound(f"sandbox '{sandbox_id}' not found")
        return record

    async def list(self) -> list[SandboxRecord]:
        return [r for r in await self.store.list() if r.state != State.KILLING]

    async def metrics(self, sandbox_id: str) -> dict[str, Any] | None:
        """The guest's current resource figures; None unless it is running."""
        record = await self.get(sandbox_id)
        if self.route(sandbox_id) is None:
            return None
        try:
            sample = await self.agent(record).metrics()
        except httpx.HTTPError as exc:
            raise Unavailable(f"sandbox '{sandbox_id}' did not report metrics: {exc}") from exc
        self.metrics_history.record(sandbox_id, sample)
        return sample

    async def logs(self, sandbox_id: str, start_ms: int = 0) -> builtins.list[dict[str, Any]]:
        """The sandbox's log entries from `start_ms`, oldest first: its guest keeps them (in
        its memory, so across pauses); none while it is paused."""
        record = await self.get(sandbox_id)
        if self.route(sandbox_id) is None:
            return []
        try:
            return await self.agent(record).logs(start_ms)
        except httpx.HTTPError as exc:
            raise Unavailable(f"sandbox '{sandbox_id}' did not report its logs: {exc}") from exc

    def route(self, sandbox_id: str) -> Route | None:
        return self._routes.get(sandbox_id)

    def egress_rules_at(self, address: str) -> EgressRules | None:
        """The egress rules of the running sandbox at namespace address `address`."""
        return next((r.egress for r in self._routes.values() if r.host == address), None)

    def routes(self) -> builtins.list[tuple[str, Route]]:
        """Every running sandbox's route, as a list the caller may keep."""
        return list(self._routes.items())

    # -- create ----------------------------------------------------------------------

    async def new_record(
        self,
        *,
        template_id: str,
        alias: str | None,
        timeout: int,
        vcpus: int,
        memory_mb: int,
        metadata: dict[str, str],
        env_vars: dict[str, str],
        guest: dict[str, Any],
        auto_pause: bool,
        auto_pause_memory: bool,
        allow_internet: bool,
        secure: bool,
        layers: dict[str, str] | None = None,
        reserved: tuple[str, int] | None = None,
        pause_after_idle: int = 0,
        auto_resume: bool = False,
        network: dict[str, Any] | None = None,
        volume_mounts: builtins.list[dict[str, str]] | None = None,
    ) -> SandboxRecord:
        """Admit a sandbox and store its `creating` record with a free network slot (or
        the `reserved` id and slot of a warm VM); `layers` are stored ones its files start
        from (its first upload's parents)."""
        started = now()
        async with self._admission_lock:
            record = SandboxRecord(
                sandbox_id=reserved[0] if reserved else new_sandbox_id(),
                template_id=template_id,
                alias=alias,
                state=State.CREATING,
                started_at=started,
                end_at=started + timedelta(seconds=timeout),
                vcpus=vcpus,
                memory_mb=memory_mb,
                disk_mb=self.cfg.sandbox.disk_size_mb,
                slot=0,
                metadata=metadata,
                env_vars=env_vars,
                guest=guest,
                auto_pause=auto_pause,
                auto_pause_memory=auto_pause_memory,
                allow_internet=allow_internet,
                access_token=secrets.token_hex(16) if secure else None,
                layers=dict(layers or {}),
                pause_after_idle=pause_after_idle,
                auto_resume=auto_resume,
                network=dict(network or {}),
                traffic_token=traffic_token_for(network or {}),
                volume_mounts=list(volume_mounts or []),
            )
            await self._admit(demand_of(record))
            record.slot = reserved[1] if reserved else await self._free_slot()
            await self.store.insert(record)
        crash_point("create.recorded")
        return record

    async def _free_slot(self) -> int:
        """A network slot no record and no warm VM holds (under the admission lock), and
        whose interfaces are gone (a sandbox that moved to another node may still hold
        them for a moment: `handoff.py`)."""
        used = {r.slot for r in await self.store.list()} | self._held_slots
        busy = self.networks.slot_busy
        return next(i for i in itertools.count() if i not in used and not busy(i))

    async def hold_slot(self) -> int:
        """Hold a network slot for a VM that is no sandbox yet."""
        async with self._admission_lock:
            slot = await self._free_slot()
            self._held_slots.add(slot)
            return slot

    async def release_slot(self, slot: int) -> None:
        self._held_slots.discard(slot)

    async def bring_up(
        self, record: SandboxRecord, provision: Callable[[CleanupStack], Awaitable[None]]
    ) -> SandboxRecord:
        """Run `provision` for a new record; on any failure (or a kill) every acquired
        resource goes, the record last."""
        with timed("create"):
            cleanup = CleanupStack(f"create sandbox {record.sandbox_id} ({record.template_id})")
            cleanup.push("state record", lambda: self.store.delete(record.sandbox_id))
            async with self.lock(record.sandbox_id):
                try:
                    await self._run_killable(record.sandbox_id, provision(cleanup))
                    crash_point("create.provisioned")
                    await self._transition(record, Event.DONE)
                except BaseException:
                    await self._transition(record, Event.FAILED)
                    await cleanup.run()
                    raise
        cleanup.dismiss()
        log.info("sandbox %s running (slot %d)", record.sandbox_id, record.slot)
        return record

    async def make_disk(
        self, record: SandboxRecord, template: Template, cleanup: CleanupStack
    ) -> None:
        """The sandbox's work directory and its disk over the template's image."""
        overlay = self.make_workdir(record, cleanup) / "rootfs.qcow2"
        # Every disk gets the boot snapshots' size when its image fits (the guest sees it).
        size = DISK_BYTES if _disk_size(template) <= DISK_BYTES else None
        try:
            await create_qcow2(
                overlay, size, backing=template.rootfs, backing_format=template.rootfs_format
            )
        except VmmError as exc:
            raise Unavailable(str(exc)) from exc

    async def start_fresh_guest(
        self, record: SandboxRecord, kit: Kit, cleanup: CleanupStack
    ) -> None:
        """A guest that has not run before (the boot snapshot's, or booted) on the sandbox's
        disk, given the sandbox's environment; its VM's undo goes onto `cleanup`."""
        agent = self.agent(record)
        disk = self.workdir(record.sandbox_id) / "rootfs.qcow2"
        restorable = await asyncio.to_thread(qcow2_virtual_size, disk) == DISK_BYTES
        handle = await self.launcher.start(self.vm_spec(record, kit), agent, restorable)
        cleanup.push("vm", lambda: self.driver.stop(handle))
        crash_point("create.vm")
        await self.save_vm(record, handle, kit)
        await self.initialize_guest(record, agent)

    async def initialize_guest(self, record: SandboxRecord, agent: AgentClient) -> None:
        """Give a guest that has not run before the sandbox's environment and command."""
        guest = record.guest
        await init_agent(record, agent, self.cfg.net.guest_gateway)
        crash_point("create.initialized")
        if guest.get("command"):
            try:
                await agent.start_detached(guest["command"], tag="entrypoint")
            except (httpx.HTTPError, ConnectError) as exc:
                # The sandbox is usable without it; the image's command is a convenience.
                log.warning("sandbox %s: image command failed to start: %s", record.sandbox_id, exc)

    def make_workdir(self, record: SandboxRecord, cleanup: CleanupStack) -> Path:
        workdir = self.workdir(record.sandbox_id)
        workdir.mkdir(parents=True)
        cleanup.push("workdir", lambda: asyncio.to_thread(shutil.rmtree, workdir, True))
        write_init_secret(workdir)
        return workdir

    def vm_spec(self, record: SandboxRecord, kit: Kit) -> VmSpec:
        return sandbox_vm(
            kit,
            f"aenv-{record.sandbox_id}",
            Shape(record.vcpus, record.memory_mb),
            self.workdir(record.sandbox_id) / "rootfs.qcow2",
            self.workdir(record.sandbox_id),
            guest_kernel_args(self.cfg),
            self.networks.plan(record).netns,
        )

    async def save_vm(self, record: SandboxRecord, handle: VmHandle, kit: Kit) -> None:
        # The kit is pinned: a paused guest has its runtime disk mounted and must get it back.
        handle.extra["kit"] = kit.version
        record.vm = handle.to_dict()
        await self.store.update(record.sandbox_id, vm=record.vm)

    def pinned_kit(self, record: SandboxRecord) -> Kit:
        """The kit a sandbox's guest runs on (a restored kernel keeps its runtime disk)."""
        return self.kit_version((record.vm or {}).get("extra", {}).get("kit", self.kit.version))

    def kit_version(self, version: str) -> Kit:
        kit = self.kit if version == self.kit.version else load_kit(self.cfg, version)
        if kit is None:
            raise Unavailable(f"kit {version}, which this guest's memory was saved with, is gone")
        return kit

    # -- changes ---------------------------------------------------------------------

    async def kill(self, sandbox_id: str) -> None:
        """Kill from any state: an operation under way is cancelled (and undone) first."""
        operation = self._operations.get(sandbox_id)
        if operation is not None:
            operation.cancel()
        async with self.lock(sandbox_id):
            await self._stop_reader(sandbox_id)
            record = await self.store.get(sandbox_id)
            if record is None:
                if operation is not None:
                    return  # a create, cancelled: it removed everything itself
                raise NotFound(f"sandbox '{sandbox_id}' not found")
            await self._transition(record, Event.KILL)
            await self.teardown(record)
        self._locks.pop(sandbox_id, None)
        log.info("sandbox %s killed", sandbox_id)

    async def teardown(self, record: SandboxRecord) -> None:
        """Release everything a sandbox holds, then forget it; a failure keeps the record."""
        plan = self.networks.plan(record)
        cleanup = CleanupStack(f"teardown {record.sandbox_id}")
        cleanup.push("state record", lambda: self.store.delete(record.sandbox_id))
        workdir = self.workdir(record.sandbox_id)
        cleanup.push("workdir", lambda: asyncio.to_thread(shutil.rmtree, workdir, True))
        cleanup.push("network", lambda: destroy_network(plan.netns, plan.host_veth))
        if record.vm:
            handle = VmHandle.from_dict(record.vm)
            cleanup.push("vm", lambda: self.driver.stop(handle))
        errors = await cleanup.run()
        if errors:
            raise Unavailable(f"sandbox '{record.sandbox_id}' teardown incomplete: {errors[0]}")
        self.metrics_history.forget(record.sandbox_id)
        await self.networks.released(record)

    async def set_timeout(self, sandbox_id: str, timeout: int) -> None:
        """New expiry = now + timeout; it may shorten the sandbox's life as well as extend it."""
        record = await self.get(sandbox_id)
        end_at = now() + timedelta(seconds=self.clamp_timeout(timeout))
        await self.store.update(record.sandbox_id, end_at=end_at)

    async def update_network(
        self, sandbox_id: str, egress: dict[str, Any], allow_internet: bool
    ) -> None:
        """Replace a sandbox's egress rules (E2B's update: what is not given is cleared).
        Stored first: a server that dies before the namespace has them applies them on
        its restart (`SandboxNetworks.apply`)."""
        async with self.lock(sandbox_id):
            record = await self.get(sandbox_id)
            next_state(record.state, Event.RECONFIGURE)
            kept = {k: v for k, v in record.network.items() if k not in EGRESS_FIELDS}
            record.network = kept | egress
            record.allow_internet = allow_internet
            await self.store.update(
                sandbox_id, network=record.network, allow_internet=allow_internet
            )
            await self.networks.apply(record)
            if sandbox_id in self._routes:
                self.adopt(record)

    async def refresh(self, sandbox_id: str, duration: int) -> None:
        """Keep-alive: extend the expiry to at least now + duration, never shorten it."""
        record = await self.get(sandbox_id)
        end_at = max(record.end_at, now() + timedelta(seconds=self.clamp_timeout(duration)))
        await self.store.update(record.sandbox_id, end_at=end_at)

    async def flush_guest(self, record: SandboxRecord) -> None:
        """The guest writes its dirty file data to its disk; 503 when its agent is silent."""
        try:
            await self.agent(record).sync()
        except Unavailable as exc:
            raise Unavailable(
                f"sandbox '{record.sandbox_id}': its guest agent did not answer, so its "
                f"file systems cannot be flushed for a filesystem-only snapshot: {exc}"
            ) from exc

    def saved_state_intact(self, record: SandboxRecord) -> bool:
        """Whether a paused sandbox's files are a whole pause of the kind it recorded,
        here or (uploaded) in the object store."""
        return record.stored or self.local_state_intact(record)

    def local_state_intact(self, record: SandboxRecord) -> bool:
        """Whether this node holds a paused sandbox's files, whole."""
        workdir = self.workdir(record.sandbox_id)
        if record.pause_mode == FILESYSTEM:
            return (workdir / "rootfs.qcow2").is_file()
        snapshot = self.snapshot_dir(record.sandbox_id)
        return self.driver.saved_state_intact(snapshot) and guestram.holds_ram(workdir, snapshot)

    def snapshot_dir(self, sandbox_id: str) -> Path:
        return self.workdir(sandbox_id) / "snapshot"

    # -- recovery --------------------------------------------------------------------

    async def settle(self, record: SandboxRecord, event: Event) -> None:
        """Recovery's end of an operation a dead server left in a transient state."""
        await self._transition(record, event)

    def adopt(self, record: SandboxRecord) -> None:
        """Route the proxy to a running sandbox (one whose VM survived a restart too)."""
        self._routes[record.sandbox_id] = Route(
            self.networks.plan(record).ns_ip,
            record.access_token,
            record.traffic_token,
            record.network.get("maskRequestHost"),
            egress_rules(record),
        )


def _disk_size(template: Template) -> int:
    """Virtual size of a template's disk; qcow2 images never take the snapshot path."""
    if template.rootfs_format != "raw":
        return DISK_BYTES + 1
    return template.rootfs.stat().st_size
