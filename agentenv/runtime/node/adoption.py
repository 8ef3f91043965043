"""Adoption: a node takes a paused sandbox whose node was lost (or is draining), so its
next resume runs here from the object store. Only a sandbox at rest there can outlive its node (the
lifecycle's ADOPT event); the record moves by compare-and-set, so two nodes asked at once
never both take it."""

from __future__ import annotations

import logging
from typing import Any

from ...errors import Conflict, NotFound
from ...state.lifecycle import Event, next_state
from ...state.nodes import NodeRegistry
from ...state.sandboxes import SandboxRecord
from ..sandboxes.manager import SandboxManager

log = logging.getLogger(__name__)


async def adopt(manager: SandboxManager, nodes: NodeRegistry, sandbox_id: str) -> SandboxRecord:
    """The sandbox as this node's record, taken from its lost node if need be; under the
    sandbox's lock, as every state write is."""
    async with manager.gate.lock(sandbox_id):
        return await _take_over(manager, nodes, sandbox_id)


async def _take_over(
    manager: SandboxManager, nodes: NodeRegistry, sandbox_id: str
) -> SandboxRecord:
    store = manager.store
    record = await store.get_any(sandbox_id)
    if record is None:
        raise NotFound(f"sandbox '{sandbox_id}' not found")
    if record.node == store.node:
        return record
    owner = await nodes.get(record.node)
    if owner is not None and owner.state.keeps_movable:
        raise Conflict(f"sandbox '{sandbox_id}' belongs to node '{record.node}', which is up")
    if not record.stored:
        raise NotFound(
            f"sandbox '{sandbox_id}' was lost with node '{record.node}': its files never "
            "reached the object store"
        )
    record_node = record.node
    state = next_state(record.state, Event.ADOPT)
    slot = await manager.intake.hold_slot()
    try:
        if not await store.take_over(record, slot, state, _no_process(manager, record)):
            raise Conflict(f"sandbox '{sandbox_id}' changed while being adopted; try again")
    finally:
        await manager.intake.release_slot(slot)
    log.info("sandbox %s adopted from node %s", sandbox_id, record_node)
    return record


def _no_process(manager: SandboxManager, record: SandboxRecord) -> dict[str, Any] | None:
    """The lost node's VM handle made this node's: no process (pid 0 is never alive), this
    node's work directory, and the kit its saved memory needs kept."""
    if record.vm is None:
        return None
    kit = record.vm.get("extra", {}).get("kit")
    return {
        **record.vm,
        "pid": 0,
        "workdir": str(manager.machines.workdir(record.sandbox_id)),
        "extra": {} if kit is None else {"kit": kit},
    }
