"""The node runtime: creates, tracks and removes sandboxes, each a VM in its own network."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import shutil
import string
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from ..config import Config
from ..control.store import SandboxRecord, SandboxStore
from ..errors import Conflict, InvalidInput, NotFound, Unavailable
from ..guest.client import AgentClient
from ..guest.kit import Kit, guest_args, load_kit
from ..images.catalog import Template, TemplateCatalog
from ..net.netns import NetworkPlan, create_network, destroy_network, plan_network
from ..vmm.driver import VmHandle, VmmDriver, VmmError, VmSpec
from ..vmm.qemuimg import copy_sparse, create_qcow2
from .admission import admit
from .bootsnap import DISK_BYTES, BootSnapshots, Shape, sandbox_vm
from .cleanup import CleanupStack
from .lifecycle import Event, State, next_state

log = logging.getLogger(__name__)

AGENT_PORT = 49983
# A restored guest's agent answers within a second; far longer means the restore is bad.
RESTORE_TIMEOUT = 15.0
_ID_ALPHABET = string.ascii_lowercase + string.digits


@dataclass
class CreateRequest:
    template_id: str
    timeout: int
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    auto_pause: bool = False
    allow_internet: bool = True
    secure: bool = False


@dataclass(frozen=True)
class Route:
    """Where the proxy sends a sandbox's traffic, and the token it must check."""

    host: str
    access_token: str | None


def guest_kernel_args(cfg: Config) -> str:
    """The same for every sandbox (each has its own namespace), so snapshots can be shared."""
    net = cfg.net
    return guest_args(net.guest_ip, net.guest_prefix, net.guest_gateway)


def new_sandbox_id() -> str:
    return "i" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(19))


def now() -> datetime:
    return datetime.now(UTC)


class SandboxManager:
    """Owns every sandbox on this node; all lifecycle changes go through `_transition`."""

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
        self.boot_snapshots = boot_snapshots
        self.store = store
        self.driver = driver
        self.kit = kit
        self.catalog = catalog
        self._slot_lock = asyncio.Lock()
        self._locks: dict[str, asyncio.Lock] = {}
        self._routes: dict[str, Route] = {}

    # -- helpers ---------------------------------------------------------------------

    def _lock(self, sandbox_id: str) -> asyncio.Lock:
        return self._locks.setdefault(sandbox_id, asyncio.Lock())

    def workdir(self, sandbox_id: str) -> Path:
        return self.cfg.sandboxes_dir / sandbox_id

    def network_plan(self, record: SandboxRecord) -> NetworkPlan:
        net = self.cfg.net
        return plan_network(
            record.slot,
            record.sandbox_id,
            name_prefix=net.name_prefix,
            host_subnet=net.host_subnet,
            guest_ip=net.guest_ip,
            guest_gateway=net.guest_gateway,
            guest_prefix=net.guest_prefix,
        )

    def _route(self, record: SandboxRecord) -> Route:
        return Route(self.network_plan(record).ns_ip, record.access_token)

    def _agent(self, record: SandboxRecord) -> AgentClient:
        return AgentClient(
            f"http://{self.network_plan(record).ns_ip}:{AGENT_PORT}", record.access_token
        )

    async def _transition(self, record: SandboxRecord, event: Event) -> None:
        record.state = next_state(State(record.state), event)
        await self.store.update(record.sandbox_id, state=record.state)

    def _clamp_timeout(self, timeout: int) -> int:
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
        """The guest's current resource figures; None while it is paused."""
        record = await self.get(sandbox_id)
        if record.state != State.RUNNING:
            return None
        try:
            return await self._agent(record).metrics()
        except httpx.HTTPError as exc:
            raise Unavailable(f"sandbox '{sandbox_id}' did not report metrics: {exc}") from exc

    def route(self, sandbox_id: str) -> Route | None:
        return self._routes.get(sandbox_id)

    # -- create ----------------------------------------------------------------------

    async def create(self, request: CreateRequest) -> SandboxRecord:
        """Boot a sandbox; on any failure every acquired resource is released again."""
        template = await asyncio.to_thread(self.catalog.resolve, request.template_id)
        sandbox = self.cfg.sandbox
        record = await self._new_record(
            template_id=template.template_id,
            alias=template.alias,
            timeout=self._clamp_timeout(request.timeout),
            vcpus=template.vcpus or sandbox.vcpus,
            memory_mb=template.memory_mb or sandbox.memory_mb,
            metadata=request.metadata,
            env_vars=request.env_vars,
            auto_pause=request.auto_pause,
            allow_internet=request.allow_internet,
            secure=request.secure,
        )
        return await self._bring_up(
            record, lambda cleanup: self._provision(record, template, cleanup)
        )

    async def _new_record(
        self,
        *,
        template_id: str,
        alias: str | None,
        timeout: int,
        vcpus: int,
        memory_mb: int,
        metadata: dict[str, str],
        env_vars: dict[str, str],
        auto_pause: bool,
        allow_internet: bool,
        secure: bool,
    ) -> SandboxRecord:
        """Admit a sandbox and store its `creating` record with a free network slot."""
        sandbox = self.cfg.sandbox
        admit(memory_mb, sandbox.min_free_memory_mb, self.cfg.home, sandbox.min_free_disk_mb)
        started = now()
        async with self._slot_lock:
            used = {r.slot for r in await self.store.list()}
            record = SandboxRecord(
                sandbox_id=new_sandbox_id(),
                template_id=template_id,
                alias=alias,
                state=State.CREATING,
                started_at=started,
                end_at=started + timedelta(seconds=timeout),
                vcpus=vcpus,
                memory_mb=memory_mb,
                disk_mb=sandbox.disk_size_mb,
                slot=next(i for i in range(len(used) + 1) if i not in used),
                metadata=metadata,
                env_vars=env_vars,
                auto_pause=auto_pause,
                allow_internet=allow_internet,
                access_token=secrets.token_hex(16) if secure else None,
            )
            await self.store.insert(record)
        return record

    async def _bring_up(
        self, record: SandboxRecord, provision: Callable[[CleanupStack], Awaitable[None]]
    ) -> SandboxRecord:
        """Run `provision` for a new record; on any failure every acquired resource goes."""
        cleanup = CleanupStack(f"create sandbox {record.sandbox_id} ({record.template_id})")
        cleanup.push("state record", lambda: self.store.delete(record.sandbox_id))
        try:
            async with self._lock(record.sandbox_id):
                await provision(cleanup)
                await self._transition(record, Event.BOOTED)
                self._routes[record.sandbox_id] = self._route(record)
            cleanup.dismiss()
            log.info("sandbox %s running (slot %d)", record.sandbox_id, record.slot)
            return record
        except BaseException:
            await cleanup.run()
            self._locks.pop(record.sandbox_id, None)
            raise

    async def _provision(
        self, record: SandboxRecord, template: Template, cleanup: CleanupStack
    ) -> None:
        overlay = self._make_workdir(record, cleanup) / "rootfs.qcow2"
        # Every disk gets the boot snapshots' size when its image fits (the guest sees it).
        size = DISK_BYTES if _disk_size(template) <= DISK_BYTES else None
        try:
            await create_qcow2(
                overlay, size, backing=template.rootfs, backing_format=template.rootfs_format
            )
        except VmmError as exc:
            raise Unavailable(str(exc)) from exc
        await self._make_network(record, cleanup)
        spec = self._vm_spec(record, self.kit)
        handle = await self._start_vm(spec, record, restorable=size is not None)
        cleanup.push("vm", lambda: self.driver.stop(handle))
        await self._save_vm(record, handle, self.kit)
        agent = self._agent(record)
        await agent.init(
            {**template.env, **record.env_vars},
            record.access_token,
            user=template.user or None,
            workdir=template.workdir or None,
        )
        if template.command:
            try:
                await agent.start_detached(template.command, tag="entrypoint")
            except httpx.HTTPError as exc:
                # The sandbox is usable without it; the image's command is a convenience.
                log.warning("sandbox %s: image command failed to start: %s", record.sandbox_id, exc)

    def _make_workdir(self, record: SandboxRecord, cleanup: CleanupStack) -> Path:
        workdir = self.workdir(record.sandbox_id)
        workdir.mkdir(parents=True)
        cleanup.push("workdir", lambda: asyncio.to_thread(shutil.rmtree, workdir, True))
        return workdir

    async def _make_network(self, record: SandboxRecord, cleanup: CleanupStack) -> None:
        plan = self.network_plan(record)
        await create_network(plan, record.allow_internet)
        cleanup.push("network", lambda: destroy_network(plan.netns, plan.host_veth))

    def _vm_spec(self, record: SandboxRecord, kit: Kit) -> VmSpec:
        return sandbox_vm(
            kit,
            f"aenv-{record.sandbox_id}",
            Shape(record.vcpus, record.memory_mb),
            self.workdir(record.sandbox_id) / "rootfs.qcow2",
            self.workdir(record.sandbox_id),
            guest_kernel_args(self.cfg),
            self.network_plan(record).netns,
        )

    async def _save_vm(self, record: SandboxRecord, handle: VmHandle, kit: Kit) -> None:
        # The kit is pinned: a paused guest has its runtime disk mounted and must get it back.
        handle.extra["kit"] = kit.version
        record.vm = handle.to_dict()
        await self.store.update(record.sandbox_id, vm=record.vm)

    def _pinned_kit(self, record: SandboxRecord) -> Kit:
        version = (record.vm or {}).get("extra", {}).get("kit", self.kit.version)
        kit = self.kit if version == self.kit.version else load_kit(self.cfg, version)
        if kit is None:
            raise Unavailable(f"kit {version}, which this sandbox runs on, is gone")
        return kit

    async def _start_vm(self, spec: VmSpec, record: SandboxRecord, restorable: bool) -> VmHandle:
        """Restore from the boot snapshot of the VM's shape if there is one, else boot."""
        snapshots = self.boot_snapshots
        if snapshots is None or not restorable:
            return await self._boot(spec, record)
        shape = Shape(spec.vcpus, spec.memory_mb)
        snapshot = snapshots.ready(shape)
        if snapshot is None:
            snapshots.request(shape)
            return await self._boot(spec, record)
        try:
            return await self._restored(spec, record, snapshot)
        except (VmmError, TimeoutError) as exc:
            log.warning("restore of %s failed, booting instead: %s", spec.name, exc)
            snapshots.discard(shape)
        return await self._boot_fresh(spec, record)

    async def _restored(self, spec: VmSpec, record: SandboxRecord, saved: Path) -> VmHandle:
        """`spec` restored from the state in `saved`, its agent answering; on any failure
        (VmmError, TimeoutError) the VM is stopped again."""
        handle = await self.driver.restore(spec, saved)
        try:
            await self._await_agent(handle, record, RESTORE_TIMEOUT, poll=0.02)
        except BaseException:
            await self.driver.stop(handle)
            raise
        return handle

    async def _await_agent(
        self, handle: VmHandle, record: SandboxRecord, timeout: float, poll: float
    ) -> None:
        """Until the guest's agent answers; TimeoutError after `timeout`, VmmError if QEMU exits."""
        agent = self._agent(record)
        async with asyncio.timeout(timeout):
            while not await agent.healthy():
                if not self.driver.is_alive(handle):
                    raise VmmError("the VM exited before its agent answered")
                await asyncio.sleep(poll)

    async def _boot_fresh(self, spec: VmSpec, record: SandboxRecord) -> VmHandle:
        """Boot after a failed restore, without its RAM and with its console kept aside."""
        (spec.workdir / "memory").unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (spec.workdir / "console.log").rename(spec.workdir / "console.restore.log")
        return await self._boot(spec, record)

    async def _boot(self, spec: VmSpec, record: SandboxRecord) -> VmHandle:
        """Boot with a deadline; retry once, since TCG guests occasionally stall early."""
        attempts = max(1, self.cfg.sandbox.boot_attempts)
        problem = ""
        for attempt in range(1, attempts + 1):
            handle = await self.driver.boot(spec)
            try:
                await self._await_agent(handle, record, self.cfg.sandbox.boot_timeout, poll=0.1)
                return handle
            except (TimeoutError, VmmError) as exc:
                problem = str(exc) or f"no answer within {self.cfg.sandbox.boot_timeout:.0f}s"
                tail = _tail(handle.console_log)
                log.warning(
                    "boot attempt %d of %s failed: %s\n%s", attempt, spec.name, problem, tail
                )
                await self.driver.stop(handle)
                handle.console_log.rename(handle.console_log.with_suffix(f".{attempt}.log"))
            except BaseException:
                await self.driver.stop(handle)
                raise
        raise Unavailable(f"sandbox did not boot after {attempts} attempts: {problem}")

    # -- changes ---------------------------------------------------------------------

    async def kill(self, sandbox_id: str) -> None:
        async with self._lock(sandbox_id):
            # Read under the lock: a concurrent change must not be acted on twice.
            record = await self.get(sandbox_id)
            await self._transition(record, Event.KILL)
            self._routes.pop(sandbox_id, None)
            await self.teardown(record)
        self._locks.pop(sandbox_id, None)
        log.info("sandbox %s killed", sandbox_id)

    async def teardown(self, record: SandboxRecord) -> None:
        """Release everything a sandbox holds, then forget it; a failure keeps the record."""
        plan = self.network_plan(record)
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

    async def set_timeout(self, sandbox_id: str, timeout: int) -> None:
        """New expiry = now + timeout; it may shorten the sandbox's life as well as extend it."""
        record = await self.get(sandbox_id)
        end_at = now() + timedelta(seconds=self._clamp_timeout(timeout))
        await self.store.update(record.sandbox_id, end_at=end_at)

    async def refresh(self, sandbox_id: str, duration: int) -> None:
        """Keep-alive: extend the expiry to at least now + duration, never shorten it."""
        record = await self.get(sandbox_id)
        end_at = max(record.end_at, now() + timedelta(seconds=self._clamp_timeout(duration)))
        await self.store.update(record.sandbox_id, end_at=end_at)

    async def pause(self, sandbox_id: str) -> None:
        """Save the guest's device state next to its RAM file and stop its VMM: a paused
        sandbox holds disk, not memory or CPU, until it is resumed."""
        async with self._lock(sandbox_id):
            record = await self.get(sandbox_id)
            await self._transition(record, Event.PAUSE)
            self._routes.pop(sandbox_id, None)
            assert record.vm is not None
            handle = VmHandle.from_dict(record.vm)
            try:
                await self.driver.pause(handle, self._snapshot_dir(sandbox_id))
            except BaseException:
                with contextlib.suppress(VmmError, OSError):
                    await self.driver.resume(handle)
                await self._transition(record, Event.FAILED)
                self._routes[sandbox_id] = self._route(record)
                raise
            await self.driver.stop(handle)
            await self._transition(record, Event.PAUSED)
        log.info("sandbox %s paused", sandbox_id)

    async def connect(self, sandbox_id: str, timeout: int) -> tuple[SandboxRecord, bool]:
        """Resume a paused sandbox (True) or keep a running one (False); extends its life."""
        wanted_end = now() + timedelta(seconds=self._clamp_timeout(timeout))
        async with self._lock(sandbox_id):
            record = await self.get(sandbox_id)
            if record.state == State.RUNNING:
                if wanted_end > record.end_at:
                    record.end_at = wanted_end
                    await self.store.update(sandbox_id, end_at=wanted_end)
                return record, False
            await self._transition(record, Event.RESUME)
            try:
                await self._restore_paused(record)
            except BaseException:
                await self._transition(record, Event.FAILED)
                raise
            record.end_at = wanted_end
            await self.store.update(sandbox_id, end_at=wanted_end)
            await self._transition(record, Event.RESUMED)
            self._routes[sandbox_id] = self._route(record)
        log.info("sandbox %s resumed", sandbox_id)
        return record, True

    async def _restore_paused(self, record: SandboxRecord) -> None:
        """A new VMM from the paused sandbox's own files; the guest continues where it was."""
        assert record.vm is not None
        # A VMM still there (paused in place by an older server) would hold the tap.
        await self.driver.stop(VmHandle.from_dict(record.vm))
        kit = self._pinned_kit(record)
        spec = self._vm_spec(record, kit)
        try:
            handle = await self._restored(spec, record, self._snapshot_dir(record.sandbox_id))
            try:
                # The guest's clock stood still while it was paused; /init sets it again.
                await self._agent(record).init({}, record.access_token)
            except BaseException:
                await self.driver.stop(handle)
                raise
        except (VmmError, TimeoutError, httpx.HTTPError) as exc:
            raise Unavailable(f"sandbox {record.sandbox_id} could not be resumed: {exc}") from exc
        await self._save_vm(record, handle, kit)

    def _snapshot_dir(self, sandbox_id: str) -> Path:
        return self.workdir(sandbox_id) / "snapshot"

    async def fork(
        self, sandbox_id: str, count: int, timeout: int | None
    ) -> list[SandboxRecord | Exception]:
        """Checkpoint a running sandbox in place (it keeps its id and expiry) and start
        `count` sandboxes from that one checkpoint; each fork succeeds or fails alone."""
        checkpoint = self.cfg.home / "forks" / secrets.token_hex(8)
        async with self._lock(sandbox_id):
            source = await self.get(sandbox_id)
            if source.state != State.RUNNING:
                raise Conflict(f"sandbox {sandbox_id} is {source.state}; only running ones fork")
            await self._checkpoint(source, checkpoint)
        try:
            if timeout is None:
                timeout = self.cfg.sandbox.default_timeout
            wanted = self._clamp_timeout(timeout)
            forks = (self._fork_one(source, checkpoint, wanted) for _ in range(count))
            results = await asyncio.gather(*forks, return_exceptions=True)
        finally:
            await asyncio.to_thread(shutil.rmtree, checkpoint, True)
        outcomes: list[SandboxRecord | Exception] = []
        for result in results:
            if not isinstance(result, (SandboxRecord, Exception)):
                raise result  # a cancellation, not one fork's failure
            outcomes.append(result)
        started = sum(isinstance(r, SandboxRecord) for r in outcomes)
        log.info("sandbox %s forked into %d of %d", sandbox_id, started, count)
        return outcomes

    async def _checkpoint(self, source: SandboxRecord, checkpoint: Path) -> None:
        """Device state, RAM and disk of `source` at one instant; it runs on afterwards."""
        assert source.vm is not None
        handle = VmHandle.from_dict(source.vm)
        workdir = self.workdir(source.sandbox_id)
        checkpoint.mkdir(parents=True)
        try:
            await self.driver.pause(handle, checkpoint)
            for name in ("memory", "rootfs.qcow2"):
                await asyncio.to_thread(copy_sparse, workdir / name, checkpoint / name)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, checkpoint, True)
            raise
        finally:
            await self.driver.resume(handle)

    async def _fork_one(
        self, source: SandboxRecord, checkpoint: Path, timeout: int
    ) -> SandboxRecord:
        record = await self._new_record(
            template_id=source.template_id,
            alias=source.alias,
            timeout=timeout,
            vcpus=source.vcpus,
            memory_mb=source.memory_mb,
            metadata=dict(source.metadata),
            env_vars=dict(source.env_vars),
            auto_pause=source.auto_pause,
            allow_internet=source.allow_internet,
            secure=source.access_token is not None,
        )
        kit = self._pinned_kit(source)

        async def provision(cleanup: CleanupStack) -> None:
            workdir = self._make_workdir(record, cleanup)
            await asyncio.to_thread(
                copy_sparse, checkpoint / "rootfs.qcow2", workdir / "rootfs.qcow2"
            )
            await self._make_network(record, cleanup)
            try:
                handle = await self._restored(self._vm_spec(record, kit), record, checkpoint)
            except (VmmError, TimeoutError) as exc:
                raise Unavailable(f"fork could not start: {exc}") from exc
            cleanup.push("vm", lambda: self.driver.stop(handle))
            await self._save_vm(record, handle, kit)
            # A new clock reading, entropy of its own, and its own access token.
            await self._agent(record).init({}, record.access_token)

        return await self._bring_up(record, provision)

    # -- recovery --------------------------------------------------------------------

    def adopt(self, record: SandboxRecord) -> None:
        """Serve a sandbox whose VM survived a server restart."""
        self._routes[record.sandbox_id] = self._route(record)

    def is_resumable(self, record: SandboxRecord) -> bool:
        """A paused sandbox whose saved state survived (a server restart, say)."""
        return (self._snapshot_dir(record.sandbox_id) / "vmstate").is_file() and (
            self.workdir(record.sandbox_id) / "memory"
        ).is_file()


def _disk_size(template: Template) -> int:
    """Virtual size of a template's disk; qcow2 images never take the snapshot path."""
    if template.rootfs_format != "raw":
        return DISK_BYTES + 1
    return template.rootfs.stat().st_size


def _tail(path: Path, limit: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""
