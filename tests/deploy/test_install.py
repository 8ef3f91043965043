"""The install script for a bare host, run into a scratch root: a working `aenv` in its
own virtualenv, a config the server loads, and a unit systemd accepts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agentenv.config import load_config

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "install.sh"


@pytest.mark.slow
def test_install_into_a_scratch_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    args = [str(SCRIPT), "--root", str(root), "--no-apt", "--role", "node"]
    subprocess.run(args, check=True, capture_output=True, timeout=900)
    aenv = root / "opt/aenv/bin/aenv"
    assert "cluster" in subprocess.run([aenv, "--help"], capture_output=True, text=True).stdout
    config = root / "etc/aenv/config.toml"
    cfg = load_config(str(config))
    assert (cfg.server.role, str(cfg.home)) == ("node", "/var/lib/aenv")

    # systemd's own check, against the scratch root (its targets copied in).
    units = root / "usr/lib/systemd"
    units.mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", units / "system", symlinks=True)
    unit = root / "etc/systemd/system/aenv.service"
    verify = subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", str(unit)], capture_output=True, text=True
    )
    assert verify.returncode == 0 and not verify.stderr.strip(), verify.stderr
    assert "ExecStart=/opt/aenv/bin/aenv server" in unit.read_text()

    # Again: the config an operator edited stays.
    config.write_text(config.read_text().replace("port = 8000", "port = 9000"))
    subprocess.run(args, check=True, capture_output=True, timeout=900)
    assert load_config(str(config)).server.port == 9000
