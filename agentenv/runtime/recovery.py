"""Start-up: re-adopt sandboxes whose VMs survived, and reclaim whatever else was left."""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass, field

from ..net.netns import destroy_network, list_namespaces
from ..vmm.driver import VmHandle
from .lifecycle import State
from .manager import SandboxManager

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    adopted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    reclaimed: dict[str, int] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


async def recover(manager: SandboxManager) -> RecoveryReport:
    """Adopt live running and intact paused sandboxes, tear down the rest, then sweep
    leftovers by kind."""
    report = RecoveryReport()
    for record in await manager.store.list():
        alive = record.vm is not None and manager.driver.is_alive(VmHandle.from_dict(record.vm))
        if record.state == State.RUNNING and alive:
            manager.adopt(record)
            report.adopted.append(record.sandbox_id)
            continue
        if record.state == State.PAUSED and (alive or manager.is_resumable(record)):
            report.adopted.append(record.sandbox_id)
            continue
        try:
            await manager.teardown(record)
            report.removed.append(record.sandbox_id)
        except Exception as exc:
            report.failed[record.sandbox_id] = str(exc)
    keep = set(report.adopted) | set(report.failed)

    root = manager.cfg.sandboxes_dir
    stray_vms = {
        w: pid for w, pid in manager.driver.running_vms(root).items() if w.name not in keep
    }
    for pid in stray_vms.values():
        await manager.driver.kill_pid(pid)
    report.reclaimed["vms"] = len(stray_vms)

    prefix = manager.cfg.net.name_prefix
    namespaces = list_namespaces(prefix)
    stray_netns = [n for n in namespaces if n.removeprefix(f"{prefix}-") not in keep]
    for netns in stray_netns:
        await destroy_network(netns)
    report.reclaimed["namespaces"] = len(stray_netns)

    stray_dirs = [d for d in root.iterdir() if d.name not in keep] if root.exists() else []
    for directory in stray_dirs:
        await asyncio.to_thread(shutil.rmtree, directory, True)
    report.reclaimed["workdirs"] = len(stray_dirs)
    log.info(
        "recovery: adopted %d, removed %d, reclaimed %s, failed %d",
        len(report.adopted), len(report.removed), report.reclaimed, len(report.failed),
    )  # fmt: skip
    return report
