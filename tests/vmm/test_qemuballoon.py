"""QEMU's balloon answers as `BalloonStats`: sizes in MiB, unreported figures left out."""

from __future__ import annotations

from agentenv.vmm.driver import BalloonStats
from agentenv.vmm.qemuballoon import balloon_stats

MIB = 1024 * 1024
NEVER_SENT = 2**64 - 1


def test_a_guest_report_becomes_mib() -> None:
    reported = {
        "last-update": 1796375197,
        "stats": {
            "stat-total-memory": 470 * MIB,
            "stat-free-memory": 193 * MIB,
            "stat-available-memory": 213 * MIB,
            "stat-disk-caches": 23 * MIB,
            "stat-oom-kills": NEVER_SENT,
        },
    }
    stats = balloon_stats({"actual": 300 * MIB}, reported)
    assert stats == BalloonStats(
        300, total_mb=470, free_mb=193, available_mb=213, disk_caches_mb=23
    )


def test_before_the_first_report_only_the_size_is_known() -> None:
    reported = {"last-update": 0, "stats": {"stat-total-memory": NEVER_SENT}}
    assert balloon_stats({"actual": 512 * MIB}, reported) == BalloonStats(512)


def test_a_figure_the_guest_never_sent_is_left_out() -> None:
    reported = {
        "last-update": 1,
        "stats": {"stat-total-memory": 470 * MIB, "stat-free-memory": NEVER_SENT},
    }
    assert balloon_stats({"actual": 512 * MIB}, reported) == BalloonStats(512, total_mb=470)
