"""Stopping real QEMU processes: `stop` lets QEMU exit in order (QMP `quit`), `discard`
kills it at once, even when QEMU answers nothing at all."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agentenv.vmm.driver import VmHandle
from agentenv.vmm.qemu import QemuDriver
from agentenv.vmm.qmp import QmpClient


@pytest.fixture
def driver(tmp_path: Path) -> QemuDriver:
    return QemuDriver("qemu-system-x86_64", "tcg", tmp_path / "run")


def _started(workdir: Path) -> tuple[subprocess.Popen[bytes], VmHandle]:
    """A real QEMU waiting to be started (`-S`), its work directory on its command line
    as a sandbox's is (the driver knows its VMMs by it)."""
    workdir.mkdir()
    qmp = workdir / "vm.qmp"
    proc = subprocess.Popen(
        [
            "qemu-system-x86_64", "-M", "microvm", "-S", "-nodefaults", "-nographic",
            "-serial", f"file:{workdir / 'console.log'}",
            "-qmp", f"unix:{qmp},server=on,wait=off",
        ]
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not qmp.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "QEMU did not start"
        time.sleep(0.05)
    # Answers QMP: QEMU's main loop runs.
    asyncio.run(_answers(qmp))
    return proc, VmHandle("qemu", proc.pid, str(workdir), "tcg", {"qmp": str(qmp)})


async def _answers(qmp: Path) -> None:
    client = await QmpClient.connect(qmp, timeout=30)
    await client.close()


def test_stop_lets_qemu_exit_in_order(driver: QemuDriver, tmp_path: Path) -> None:
    proc, handle = _started(tmp_path / "vm")
    asyncio.run(driver.stop(handle))
    assert proc.wait(timeout=5) == 0  # `quit`, not a signal
    assert not driver.is_alive(handle) and not Path(handle.extra["qmp"]).exists()


def test_discard_kills_a_qemu_that_answers_nothing(driver: QemuDriver, tmp_path: Path) -> None:
    proc, handle = _started(tmp_path / "vm")
    os.kill(proc.pid, signal.SIGSTOP)  # frozen: no QMP answer, no signal handled
    asyncio.run(driver.discard(handle))
    assert proc.wait(timeout=5) == -signal.SIGKILL
    assert not driver.is_alive(handle) and not Path(handle.extra["qmp"]).exists()
    asyncio.run(driver.discard(handle))  # idempotent
