"""The sandboxes of one node: their lifecycle, one operation at a time per sandbox.

Every change of a sandbox goes through `operate` (a create through `bring_up`, a kill
through `kill`): it takes the sandbox's lock, moves it into the operation's transient
state, runs the body and ends with DONE or FAILED, each persisted before anything else
happens. Nothing else writes states, and nothing compares them: the table in
`state/lifecycle.py` decides what is allowed and answers what a state means. The steps
themselves live beside it: `machines.py` (disks, VMs, agents), `intake.py` (admission,
network slots), `routes.py` (the proxy's table), `gate.py` (locks and cancellation).
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import shutil
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import httpx

from ...config import Config
from ...crashpoints import crash_point
from ...errors import NotFound, PermanentlyUnavailable, Unavailable
from ...guest.kit import Kit
from ...images.catalog import TemplateCatalog
from ...net.rules import EGRESS_FIELDS
from ...observe.metrics import timed
from ...state.lifecycle import Event, TransitionError, next_state
from ...state.sandboxes import SandboxRecord, SandboxStore
from ...vmm.driver import VmHandle
from ..machine.bootsnap import BootSnapshots
from ..machine.cleanup import CleanupStack
from ..machine.host import MachineHost
from ..machine.network import SandboxNetworks, egress_rules
from ..memory.admission import demand_of
from ..memory.metricshistory import MetricsHistory
from .gate import OperationGate
from .intake import SandboxIntake, now
from .machines import SandboxMachines
from .routes import Route, RouteTable

log = logging.getLogger(__name__)

T = TypeVar("T")


class GuestLost(PermanentlyUnavailable):
    """A resumed guest ran but failed; its saved state no longer matches its memory."""


class SandboxManager:
    """Owns every sandbox on this node: its record's state, its route, its teardown."""

    def __init__(
        self,
        cfg: Config,
        store: SandboxStore,
        host: MachineHost,
        kit: Kit,
        catalog: TemplateCatalog,
        boot_snapshots: BootSnapshots | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.driver = host.driver
        self.networks = SandboxNetworks(cfg, host.namespaces)
        self.machines = SandboxMachines(
            cfg, store, host, kit, catalog, self.networks, boot_snapshots
        )
        self.intake = SandboxIntake(cfg, store, self.networks)
        self.routes = RouteTable()
        self.gate = OperationGate()
        self.metrics_history = MetricsHistory()
        # Set whenever a sandbox comes to rest (paused): its upload starts at once.
        self.came_to_rest = asyncio.Event()

    # -- the lifecycle ---------------------------------------------------------------

    async def _transition(self, record: SandboxRecord, event: Event) -> None:
        """Persist the next state; the proxy routes to a sandbox exactly while it runs."""
        record.state = next_state(record.state, event)
        changes: dict[str, Any] = {"state": record.state}
        if record.state.runs and record.pause_mode is not None:
            # Running, it has no pause behind it: recovery must not read one into its files.
            record.pause_mode = changes["pause_mode"] = None
        await asyncio.shield(self.store.update(record.sandbox_id, **changes))
        if record.state.runs:
            self.adopt(record)
        else:
            self.routes.drop(record.sandbox_id)
            await self.networks.stop_tunnel(record)
        if record.state.at_rest:
            self.came_to_rest.set()

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
            async with self.gate.lock(sandbox_id):
                record = await self.get(sandbox_id)
                next_state(record.state, event)  # a refused event is 409, before admission
                await self.gate.stop_reader(sandbox_id)
                if admit_memory:
                    async with self.intake.admitted(demand_of(record), exclude=sandbox_id):
                        await self._transition(record, event)
                else:
                    await self._transition(record, event)
                try:
                    result = await self.gate.run_killable(sandbox_id, body(record))
                except BaseException as exc:
                    failed = Event.LOST if isinstance(exc, GuestLost) else Event.FAILED
                    await self._transition(record, failed)
                    if record.state.going:
                        await asyncio.shield(self.teardown(record))
                    raise
                await self._transition(record, Event.DONE)
                return result

    async def change(
        self, sandbox_id: str, event: Event, body: Callable[[SandboxRecord], Awaitable[None]]
    ) -> None:
        """A one-step change (`event` keeps the state): allowed by the table, under the lock."""
        async with self.gate.lock(sandbox_id):
            record = await self.get(sandbox_id)
            next_state(record.state, event)
            await body(record)

    async def bring_up(
        self, record: SandboxRecord, provision: Callable[[CleanupStack], Awaitable[None]]
    ) -> SandboxRecord:
        """Run `provision` for a new record; on any failure (or a kill) every acquired
        resource goes, the record last."""
        with timed("create"):
            cleanup = CleanupStack(f"create sandbox {record.sandbox_id} ({record.template_id})")
            cleanup.push("state record", lambda: self.store.delete(record.sandbox_id))
            async with self.gate.lock(record.sandbox_id):
                try:
                    await self.gate.run_killable(record.sandbox_id, provision(cleanup))
                    crash_point("create.provisioned")
                    await self._transition(record, Event.DONE)
                except BaseException:
                    await self._transition(record, Event.FAILED)
                    await cleanup.run()
                    raise
        cleanup.dismiss()
        log.info("sandbox %s running (slot %d)", record.sandbox_id, record.slot)
        return record

    async def kill(self, sandbox_id: str) -> None:
        """Kill from any state: an operation under way is cancelled (and undone) first."""
        cancelled = self.gate.cancel(sandbox_id)
        async with self.gate.lock(sandbox_id):
            await self.gate.stop_reader(sandbox_id)
            record = await self.store.get(sandbox_id)
            if record is None:
                if cancelled:
                    return  # a create, cancelled: it removed everything itself
                raise NotFound(f"sandbox '{sandbox_id}' not found")
            await self._transition(record, Event.KILL)
            await self.teardown(record)
        self.gate.forget(sandbox_id)
        log.info("sandbox %s killed", sandbox_id)

    async def remove_dead(self, sandbox_id: str) -> bool:
        """Remove a running sandbox whose VM exited on its own, judged again under its lock
        on its current record: an operation (pause, rollback) stops the VM on purpose.
        Whether it was removed; while an operation holds the sandbox, it is left alone."""
        lock = self.gate.lock(sandbox_id)
        if lock.locked():
            return False
        async with lock:
            record = await self.store.get(sandbox_id)
            if record is None or record.vm is None:
                return False
            if self.driver.is_alive(VmHandle.from_dict(record.vm)):
                return False
            try:
                await self._transition(record, Event.EXITED)
            except TransitionError:
                return False  # not running (a paused sandbox keeps its last VM's handle)
            log.warning("sandbox %s: VM exited on its own; removing it", sandbox_id)
            await self.teardown(record)
        self.gate.forget(sandbox_id)
        return True

    async def teardown(self, record: SandboxRecord) -> None:
        """Release everything a sandbox holds, then forget it; a failure keeps the record."""
        plan = self.networks.plan(record)
        cleanup = CleanupStack(f"teardown {record.sandbox_id}")
        cleanup.push("state record", lambda: self.store.delete(record.sandbox_id))
        workdir = self.machines.workdir(record.sandbox_id)
        cleanup.push("workdir", lambda: asyncio.to_thread(shutil.rmtree, workdir, True))
        cleanup.push(
            "network", lambda: self.networks.namespaces.destroy(plan.netns, plan.host_veth)
        )
        if record.vm:
            handle = VmHandle.from_dict(record.vm)
            cleanup.push("vm", lambda: self.driver.discard(handle))
        errors = await cleanup.run()
        if errors:
            raise Unavailable(f"sandbox '{record.sandbox_id}' teardown incomplete: {errors[0]}")
        self.metrics_history.forget(record.sandbox_id)
        await self.networks.released(record)

    async def settle(self, record: SandboxRecord, event: Event) -> None:
        """Recovery's end of an operation a dead server left in a transient state."""
        await self._transition(record, event)

    def adopt(self, record: SandboxRecord) -> None:
        """Route the proxy to a running sandbox (one whose VM survived a restart too)."""
        self.routes.set(
            record.sandbox_id,
            Route(
                self.networks.plan(record).ns_ip,
                record.access_token,
                record.traffic_token,
                record.network.get("maskRequestHost"),
                egress_rules(record),
                frozenset(record.network.get("httpsPorts", ())),
            ),
        )

    # -- queries ---------------------------------------------------------------------

    async def get(self, sandbox_id: str) -> SandboxRecord:
        record = await self.store.get(sandbox_id)
        if record is None or not record.state.visible:
            raise NotFound(f"sandbox '{sandbox_id}' not found")
        return record

    async def list(self) -> list[SandboxRecord]:
        return [r for r in await self.store.list() if r.state.visible]

    async def metrics(self, sandbox_id: str) -> dict[str, Any] | None:
        """The guest's current resource figures; None unless it is running."""
        record = await self.get(sandbox_id)
        if self.routes.get(sandbox_id) is None:
            return None
        try:
            sample = await self.machines.agent(record).metrics()
        except httpx.HTTPError as exc:
            raise Unavailable(f"sandbox '{sandbox_id}' did not report metrics: {exc}") from exc
        self.metrics_history.record(sandbox_id, sample)
        return sample

    async def logs(self, sandbox_id: str, start_ms: int = 0) -> builtins.list[dict[str, Any]]:
        """The sandbox's log entries from `start_ms`, oldest first: its guest keeps them (in
        its memory, so across pauses); none while it is paused."""
        record = await self.get(sandbox_id)
        if self.routes.get(sandbox_id) is None:
            return []
        try:
            return await self.machines.agent(record).logs(start_ms)
        except httpx.HTTPError as exc:
            raise Unavailable(f"sandbox '{sandbox_id}' did not report its logs: {exc}") from exc

    # -- settings --------------------------------------------------------------------

    async def set_timeout(self, sandbox_id: str, timeout: int) -> None:
        """New expiry = now + timeout; it may shorten the sandbox's life as well as extend it."""
        record = await self.get(sandbox_id)
        end_at = now() + timedelta(seconds=self.intake.clamp_timeout(timeout))
        await self.store.update(record.sandbox_id, end_at=end_at)

    async def set_auto_pause(self, sandbox_id: str, auto_pause: bool) -> None:
        """Whether its timeout pauses the sandbox (true) or kills it."""
        record = await self.get(sandbox_id)
        await self.store.update(record.sandbox_id, auto_pause=auto_pause)

    async def refresh(self, sandbox_id: str, duration: int) -> None:
        """Keep-alive: extend the expiry to at least now + duration, never shorten it."""
        record = await self.get(sandbox_id)
        end_at = max(record.end_at, now() + timedelta(seconds=self.intake.clamp_timeout(duration)))
        await self.store.update(record.sandbox_id, end_at=end_at)

    async def update_network(
        self, sandbox_id: str, egress: dict[str, Any], allow_internet: bool
    ) -> None:
        """Replace a sandbox's egress rules (E2B's update: what is not given is cleared).
        Stored first: a server that dies before the namespace has them applies them on
        its restart (`SandboxNetworks.apply`)."""

        async def reconfigure(record: SandboxRecord) -> None:
            kept = {k: v for k, v in record.network.items() if k not in EGRESS_FIELDS}
            record.network = kept | egress
            record.allow_internet = allow_internet
            await self.store.update(
                sandbox_id, network=record.network, allow_internet=allow_internet
            )
            await self.networks.apply(record)
            if sandbox_id in self.routes:
                self.adopt(record)

        await self.change(sandbox_id, Event.RECONFIGURE, reconfigure)

    async def set_lineage(
        self, sandbox_id: str, layers: dict[str, str], stored: bool = False
    ) -> None:
        """Record stored layers of a sandbox's files: `stored`, they are its paused files
        now; else only an ancestor of them, what its next upload is diffed against (kept
        off a sandbox whose paused files are stored, whose layers must stay theirs)."""
        async with self.gate.lock(sandbox_id):
            record = await self.store.get(sandbox_id)
            if record is None or (record.stored and not stored):
                return
            await self.store.update(sandbox_id, layers=layers, stored=stored)
