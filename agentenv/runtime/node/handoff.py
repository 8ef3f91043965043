"""What a node still holds of sandboxes that moved to another node (off a draining node):
their network namespace and local files go. Their state is in the object store and their
record is the other node's, so nothing here is needed any more, and a slot's names must
be free for the next sandbox that gets the slot."""

from __future__ import annotations

import asyncio
import logging
import shutil

from ..sandboxes.manager import SandboxManager

log = logging.getLogger(__name__)


async def release_moved(manager: SandboxManager) -> int:
    """Remove the local leftovers of sandboxes now owned by another node; how many."""
    prefix = manager.cfg.net.name_prefix
    root = manager.cfg.sandboxes_dir
    namespaces = manager.networks.namespaces
    local = {n.removeprefix(f"{prefix}-") for n in namespaces.listed(prefix)}
    if root.is_dir():
        local |= {d.name for d in root.iterdir()}
    if not local:
        return 0
    owners = await manager.store.owners(sorted(local))
    moved = [i for i, node in owners.items() if node != manager.store.node]
    for sandbox_id in moved:
        await namespaces.destroy(f"{prefix}-{sandbox_id}")
        await asyncio.to_thread(shutil.rmtree, root / sandbox_id, True)
        log.info(
            "sandbox %s moved to node %s: its local copy is gone", sandbox_id, owners[sandbox_id]
        )
    return len(moved)
