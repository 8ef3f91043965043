"""The `systemctl` stand-in templates get (`images/systemctl.sh`), run under `sh` here on
a unit tree in a temporary root: a unit's service starts detached and stops."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
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
