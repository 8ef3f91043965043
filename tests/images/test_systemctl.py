"""The `systemctl` stand-in templates get (`images/systemctl.sh`), run under `sh` here on
a unit tree in a temporary root: a unit's service starts detached, is restarted as its
Restart= says, and stops (with the units that are PartOf it)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path

import pytest

from agentenv.images.buildscripts import systemctl_script

SCRIPT = str(files("agentenv.images") / "systemctl.sh")

UNIT = """\
[Unit]
Description=a test service
Wants=helper.service

[Service]
Type=simple
WorkingDirectory={work}
Environment=GREETING=hello "SPACED=two words"
EnvironmentFile=-{root}/etc/missing.env
EnvironmentFile={root}/etc/svc.env
ExecStartPre=-/bin/false
ExecStartPre=/bin/sh -c 'echo pre > {work}/pre'
ExecStart=/bin/sh -c 'echo "$GREETING $SPACED $FROM_FILE in $(pwd)"; exec sleep 300'
Restart=on-failure
"""

HELPER = """\
[Service]
Type=simple
ExecStart=/bin/sleep 300
"""


def _systemctl(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AENV_SYSTEMCTL_ROOT": str(root)}
    return subprocess.run(["sh", SCRIPT, *args], env=env, capture_output=True, text=True)


def _pid(root: Path, unit: str) -> int:
    return int((root / "run/aenv-units" / f"{unit}.pid").read_text())


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture
def root(tmp_path: Path) -> Path:
    units = tmp_path / "etc/systemd/system"
    units.mkdir(parents=True)
    (tmp_path / "lib/systemd/system").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    (tmp_path / "etc/svc.env").write_text("FROM_FILE=filed\n")
    (units / "svc.service").write_text(UNIT.format(root=tmp_path, work=tmp_path / "work"))
    (tmp_path / "lib/systemd/system/helper.service").write_text(HELPER)
    return tmp_path


def test_a_unit_starts_detached_and_stops(root: Path) -> None:
    started = _systemctl(root, "start", "svc")
    assert started.returncode == 0, started.stderr
    pid, helper = _pid(root, "svc.service"), _pid(root, "helper.service")
    try:
        assert _alive(pid) and _alive(helper)
        assert (root / "work/pre").read_text() == "pre\n"
        assert _systemctl(root, "is-active", "svc.service").stdout == "active\n"
        assert _systemctl(root, "status", "svc").returncode == 0
        # Starting a running unit again changes nothing.
        assert _systemctl(root, "start", "svc").returncode == 0
        assert _pid(root, "svc.service") == pid
        log = root / "var/log/svc.log"
        deadline = time.monotonic() + 10
        while "hello" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"hello two words filed in {root / 'work'}" in log.read_text()
        stopped = _systemctl(root, "stop", "svc")
        assert stopped.returncode == 0, stopped.stderr
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)
        inactive = _systemctl(root, "is-active", "svc")
        assert (inactive.stdout, inactive.returncode) == ("inactive\n", 3)
        assert _systemctl(root, "status", "svc").returncode == 3
    finally:
        for unit in ("svc", "helper"):
            _systemctl(root, "stop", unit)
    assert not _alive(helper)


def test_a_failing_start_pre_fails_the_start(root: Path) -> None:
    unit = root / "etc/systemd/system/broken.service"
    unit.write_text("[Service]\nExecStartPre=/bin/false\nExecStart=/bin/sleep 300\n")
    failed = _systemctl(root, "start", "broken")
    assert failed.returncode == 1 and "ExecStartPre failed" in failed.stderr
    assert not (root / "run/aenv-units/broken.service.pid").exists()


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_restart_on_failure_restarts_a_killed_service_not_a_clean_exit(root: Path) -> None:
    runs = root / "work/runs"
    unit = root / "etc/systemd/system/kept.service"
    unit.write_text(
        "[Service]\nRestart=on-failure\nRestartSec=100ms\n"
        f"ExecStartPost=-/bin/sh -c 'echo post >> {root}/work/post'\n"
        f"ExecStart=/bin/sh -c 'echo run >> {runs}; exec sleep 300'\n"
    )
    assert _systemctl(root, "start", "kept").returncode == 0
    supervisor = _pid(root, "kept.service")
    try:
        _wait_for(lambda: _lines(runs) == ["run"], "the service ran")
        assert _lines(root / "work/post") == ["post"]
        (first,) = _children(supervisor)
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: len(_lines(runs)) == 2, "a killed service is restarted")
        _wait_for(lambda: len(_children(supervisor)) == 1, "the new service runs")
        assert _children(supervisor) != [first]
        assert _systemctl(root, "is-active", "kept").stdout == "active\n"
        # SIGTERM is a clean end: on-failure leaves the unit stopped.
        os.kill(_children(supervisor)[0], signal.SIGTERM)
        _wait_for(lambda: not _alive(supervisor), "a clean end is not restarted")
        assert _systemctl(root, "is-active", "kept").stdout == "inactive\n"
        assert len(_lines(runs)) == 2
    finally:
        _systemctl(root, "stop", "kept")


def test_a_failed_start_pre_is_retried_as_restart_says(root: Path) -> None:
    """E2B's code-interpreter unit waits for Jupyter in ExecStartPre and relies on this."""
    flag = root / "work/ready"
    unit = root / "etc/systemd/system/waits.service"
    unit.write_text(
        "[Service]\nRestart=on-failure\nRestartSec=0.2\n"
        f"ExecStartPre=/bin/test -e {flag}\nExecStart=/bin/sleep 300\n"
    )
    try:
        failed = _systemctl(root, "start", "waits")
        assert failed.returncode == 1 and "ExecStartPre failed" in failed.stderr
        supervisor = _pid(root, "waits.service")
        flag.touch()
        _wait_for(lambda: len(_children(supervisor)) == 1, "the start is retried")
        assert _systemctl(root, "is-active", "waits").stdout == "active\n"
    finally:
        _systemctl(root, "stop", "waits")


def test_e2bs_unit_pair_starts_once_and_stops_together(root: Path) -> None:
    """jupyter wants code-interpreter, which requires and is part of jupyter, as E2B's."""
    units = root / "etc/systemd/system"
    (units / "jupyter.service").write_text(
        "[Unit]\nWants=code-interpreter.service\n[Service]\nExecStart=/bin/sleep 300\n"
        "ExecStartPost=-/usr/bin/systemctl reset-failed code-interpreter\nRestart=on-failure\n"
    )
    (units / "code-interpreter.service").write_text(
        "[Unit]\nRequires=jupyter.service\nAfter=jupyter.service\nPartOf=jupyter.service\n"
        "[Service]\nExecStart=/bin/sleep 300\nRestart=on-failure\n"
    )
    try:
        assert _systemctl(root, "start", "jupyter").returncode == 0
        jupyter, interpreter = _pid(root, "jupyter.service"), _pid(root, "code-interpreter.service")
        assert _alive(jupyter) and _alive(interpreter)
        assert not list((root / "run/aenv-units").glob("*.starting"))
        restarted = _systemctl(root, "restart", "jupyter")
        assert restarted.returncode == 0, restarted.stderr
        assert not _alive(interpreter), "a PartOf unit restarts with its whole"
        assert _alive(_pid(root, "code-interpreter.service"))
        interpreter = _pid(root, "code-interpreter.service")
        assert _systemctl(root, "stop", "jupyter").returncode == 0
        _wait_for(lambda: not _alive(interpreter), "a PartOf unit stops with its whole")
        assert _systemctl(root, "is-active", "code-interpreter").stdout == "inactive\n"
    finally:
        for unit in ("jupyter", "code-interpreter"):
            _systemctl(root, "stop", unit)


def test_unknown_units_and_verbs_are_errors(root: Path) -> None:
    missing = _systemctl(root, "start", "nope")
    assert missing.returncode == 5 and "nope.service not found" in missing.stderr
    assert _systemctl(root, "isolate", "svc").returncode == 1
    # Enabling records nothing (no boot to start at); daemon-reload is a no-op.
    assert _systemctl(root, "enable", "svc").returncode == 0
    assert _systemctl(root, "daemon-reload").returncode == 0
    assert not (root / "run/aenv-units/svc.service.pid").exists()


@pytest.mark.parametrize("usr_bin", [False, True], ids=["busybox-only", "with-usr-bin"])
def test_the_install_works_in_a_busybox_root(tmp_path: Path, usr_bin: bool) -> None:
    """Installed as a build installs it, in a root of busybox alone (no /usr/bin, no dpkg)."""
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for tool in ("sh", "mkdir", "cat", "chmod", "grep", "ln", "mv"):
        (root / "bin" / tool).symlink_to("busybox")
    if usr_bin:
        (root / "usr" / "bin").mkdir(parents=True)
    done = subprocess.run(
        ["chroot", str(root), "/bin/sh", "-c", systemctl_script()], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "AgentENV's systemctl" in (root / "usr/local/bin/systemctl").read_text()
    linked = root / "usr/bin/systemctl"
    assert linked.is_symlink() == usr_bin
    if usr_bin:
        assert os.readlink(linked) == "/usr/local/bin/systemctl"
