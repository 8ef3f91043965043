"""The host accounting the VM factory checks with, on processes and files made here."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .live import HostResources, LiveServer, leftovers, sweep


@pytest.fixture
def stray(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process that names the home on its command line, as a forgotten helper would."""
    helper = [sys.executable, "-c", "import time; time.sleep(600)", str(tmp_path / "home")]
    proc = subprocess.Popen(helper)
    yield proc
    proc.kill()
    proc.wait()


def test_a_process_naming_the_home_is_a_stray_daemon(
    tmp_path: Path, stray: subprocess.Popen[bytes]
) -> None:
    server = LiveServer(tmp_path / "home")
    assert server.resources().daemons == 1
    assert leftovers(server) == [f"process {stray.pid}"]
    sweep(server)
    assert stray.wait(10) == -signal.SIGKILL
    assert server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)
    assert leftovers(server) == []


def test_scratch_counts_what_the_node_stages_and_transient_ignores_snapshots(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    staged = ("snapshots/.staging/app-v1", "cache/chunks/ab/.tmp-x1", "snapshots/app/v1")
    for path in (*staged, "volumes/.spool/node-2"):  # a node's spool is there while it runs
        (home / path).mkdir(parents=True)
    (home / ".upload-x2").write_bytes(b"")
    (home / "volumes/.spool/node-1").mkdir(parents=True)
    (home / "volumes/.spool/node-1/vol-a-upload").write_bytes(b"")
    found = LiveServer(home).resources()
    assert (found.scratch, found.snapshots) == (4, 2)  # staging counts as both
    assert found.transient() == HostResources(0, 0, 0, 0, 0, 0, 0, scratch=4)


def test_within_a_baseline_means_nothing_more_of_any_kind() -> None:
    baseline = HostResources(1, 1, 2, 1, 0, 1, 0, daemons=1)
    assert HostResources(1, 1, 2, 1, 0, 1, 0).within(baseline)  # a daemon went: fine
    assert not HostResources(1, 2, 2, 1, 0, 1, 0, daemons=1).within(baseline)  # a namespace
