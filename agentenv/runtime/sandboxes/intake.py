"""The intake of new sandboxes: admitted against the host's memory and disk, then stored in state
`creating` with a network slot no other sandbox (or warm VM) holds.

Past capacity, a create (or a resume) waits in line: first come, first admitted, each for
at most `sandbox.admission_wait` seconds from its arrival, then `AtCapacity` (429 with
Retry-After, which E2B's SDKs retry). Only the head of the line tries, so a small
sandbox never overtakes a large one that came first.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import secrets
import string
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from ...config import Config
from ...crashpoints import crash_point
from ...errors import AtCapacity, InvalidInput
from ...state.lifecycle import State
from ...state.sandboxes import SandboxOptions, SandboxRecord, SandboxStore
from ..machine.bootsnap import Shape
from ..machine.network import SandboxNetworks, traffic_token_for
from ..memory.admission import Demand, admit, committed_by, demand_of, host_capacity

_ID_ALPHABET = string.ascii_lowercase + string.digits
# Seconds between the head of the line's tries: room frees when another sandbox ends.
RETRY_INTERVAL = 0.1


def new_sandbox_id() -> str:
    return "i" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(19))


def now() -> datetime:
    return datetime.now(UTC)


class SandboxIntake:
    """Admits new sandboxes one at a time: what is committed is read, then more committed."""

    def __init__(self, cfg: Config, store: SandboxStore, networks: SandboxNetworks) -> None:
        self.cfg = cfg
        self.store = store
        self.networks = networks
        self.capacity = host_capacity(cfg.sandbox, cfg.home)
        self.lock = asyncio.Lock()
        # Who waits for room, first come first: one object per waiting request.
        self._line: collections.deque[object] = collections.deque()
        self._turns = asyncio.Condition()
        # Why the head of the line was last refused (told to those behind it).
        self._refusal = "the host has no room"
        # When the line last moved (someone was admitted): waiting while it moves is
        # waiting for a turn, not for room, and does not count against the wait.
        self._moved_at = 0.0
        # Network slots held by VMs that are no sandbox yet (the warm pool's).
        self._held_slots: set[int] = set()

    def clamp_timeout(self, timeout: int) -> int:
        if timeout < 0:
            raise InvalidInput("timeout must not be negative")
        return min(timeout, self.cfg.sandbox.max_timeout)

    async def admit(self, demand: Demand, exclude: str | None = None) -> None:
        """Refuse `demand` the host cannot hold beside every other sandbox (under `lock`)."""
        held = [f for f in await self.store.footprints() if f.sandbox_id != exclude]
        committed = committed_by(held)
        await asyncio.to_thread(
            admit, demand, committed, self.capacity, self.cfg.sandbox, self.cfg.home
        )

    @asynccontextmanager
    async def admitted(self, demand: Demand, exclude: str | None = None) -> AsyncIterator[None]:
        """`demand` admitted in its turn; the block runs under `lock`, so what it records
        is committed before anyone else is admitted. `AtCapacity` once it has waited its
        wait and nobody was admitted for as long (a line that moves is no full host)."""
        loop = asyncio.get_running_loop()
        wait = self.cfg.sandbox.admission_wait
        arrived = loop.time()
        ticket = object()
        self._line.append(ticket)
        try:
            if not await self._turn(ticket, arrived, wait):
                ahead = self._line.index(ticket)
                raise AtCapacity(
                    f"{self._refusal} ({ahead} earlier requests wait for room; waited {wait:g} s)"
                )
            while True:
                async with self.lock:
                    try:
                        await self.admit(demand, exclude)
                    except AtCapacity as refusal:
                        self._refusal = refusal.message
                        if loop.time() + RETRY_INTERVAL > self._gives_up(arrived, wait):
                            message = f"{refusal.message} (waited {wait:g} s for room)"
                            raise AtCapacity(message) from None
                    else:
                        self._moved_at = loop.time()
                        yield
                        return
                await asyncio.sleep(RETRY_INTERVAL)
        finally:
            self._line.remove(ticket)
            async with self._turns:
                self._turns.notify_all()

    def _gives_up(self, arrived: float, wait: float) -> float:
        """When a request that `arrived` gives up: `wait` after it came, or after the line
        last moved, whichever is later."""
        return max(arrived, self._moved_at) + wait

    async def _turn(self, ticket: object, arrived: float, wait: float) -> bool:
        """Wait until `ticket` heads the line; False once it gives up first."""
        loop = asyncio.get_running_loop()
        async with self._turns:
            while self._line[0] is not ticket:
                timeout = self._gives_up(arrived, wait) - loop.time()
                if timeout <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._turns.wait(), timeout)
        return True

    async def new_record(
        self,
        *,
        template_id: str,
        alias: str | None,
        timeout: int,
        shape: Shape,
        guest: dict[str, Any],
        options: SandboxOptions,
        layers: dict[str, str] | None = None,
        reserved: tuple[str, int] | None = None,
        disk_mb: int | None = None,
    ) -> SandboxRecord:
        """Admit a sandbox and store its `creating` record with a free network slot (or
        the `reserved` id and slot of a warm VM); `layers` are stored ones its files start
        from (its first upload's parents)."""
        started = now()
        record = SandboxRecord(
            sandbox_id=reserved[0] if reserved else new_sandbox_id(),
            template_id=template_id,
            alias=alias,
            state=State.CREATING,
            started_at=started,
            end_at=started + timedelta(seconds=timeout),
            vcpus=shape.vcpus,
            memory_mb=shape.memory_mb,
            disk_mb=disk_mb or self.cfg.sandbox.disk_size_mb,
            slot=0,
            guest=guest,
            access_token=secrets.token_hex(16) if options.secure else None,
            layers=dict(layers or {}),
            traffic_token=traffic_token_for(options.network),
            **options.record_fields(),
        )
        async with self.admitted(demand_of(record)):
            record.slot = reserved[1] if reserved else await self._free_slot()
            await self.store.insert(record)
        crash_point("create.recorded")
        return record

    async def _free_slot(self) -> int:
        """A network slot no record and no warm VM holds (under the lock), and whose
        interfaces are gone (a sandbox that moved to another node may still hold them for
        a moment: `runtime/node/handoff.py`)."""
        used = {f.slot for f in await self.store.footprints()} | self._held_slots
        busy = self.networks.slot_busy
        return next(i for i in itertools.count() if i not in used and not busy(i))

    async def hold_slot(self) -> int:
        """Hold a network slot for a VM that is no sandbox yet."""
        async with self.lock:
            slot = await self._free_slot()
            self._held_slots.add(slot)
            return slot

    async def release_slot(self, slot: int) -> None:
        self._held_slots.discard(slot)
