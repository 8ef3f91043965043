"""A QEMU VM's balloon over QMP: its size and the statistics its guest reports."""

from __future__ import annotations

from typing import Any

from .driver import BalloonStats, VmmError
from .qmp import QmpClient

MIB = 1024 * 1024
# Seconds between the guest's balloon statistics reports, once someone asked for them.
_BALLOON_POLL_S = 5
# The guest statistics QEMU reports (bytes), by the field of `BalloonStats` they fill.
_GUEST_STATS = {
    "total_mb": "stat-total-memory",
    "free_mb": "stat-free-memory",
    "available_mb": "stat-available-memory",
    "disk_caches_mb": "stat-disk-caches",
}


def balloon_stats(actual: Any, reported: Any) -> BalloonStats:
    """`query-balloon` and the device's `guest-stats` as `BalloonStats` (pure)."""
    stats = reported.get("stats", {}) if reported.get("last-update") else {}
    # QEMU reports a statistic the guest never sent as all ones.
    figures = {
        field: stats[key] // MIB
        for field, key in _GUEST_STATS.items()
        if isinstance(stats.get(key), int) and stats[key] < 2**63
    }
    return BalloonStats(actual_mb=int(actual["actual"]) // MIB, **figures)


async def _device(client: QmpClient) -> str:
    """The QOM path of the VM's balloon (an anonymous device)."""
    root = "/machine/peripheral-anon"
    for child in await client.execute("qom-list", {"path": root}):
        if child["type"] == "child<virtio-balloon-device>":
            return f"{root}/{child['name']}"
    raise VmmError("the VM has no balloon device")


async def read(client: QmpClient) -> BalloonStats:
    """The balloon's size and the guest's last report; asks the guest to report from now
    on if nobody had."""
    actual = await client.execute("query-balloon")
    device = await _device(client)
    interval = {"path": device, "property": "guest-stats-polling-interval"}
    if not await client.execute("qom-get", interval):
        # This first answer predates any report.
        await client.execute("qom-set", {**interval, "value": _BALLOON_POLL_S})
    reported = await client.execute("qom-get", {"path": device, "property": "guest-stats"})
    return balloon_stats(actual, reported)
