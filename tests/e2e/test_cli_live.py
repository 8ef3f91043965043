"""`aenv` as a subprocess against a live server with real microVM sandboxes."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from ..live import AENV, TEST_KEY, LiveServer

TEMPLATE = "base"

pytestmark = pytest.mark.vm

_env: dict[str, str] = {}


@pytest.fixture(scope="module", autouse=True)
def cli_env(server: LiveServer) -> None:
    """Point the CLI at the live server through the documented environment variables."""
    _env.update(os.environ, AENV_API_URL=server.url, AENV_API_KEY=TEST_KEY)


def aenv(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [AENV, *args], capture_output=True, env=_env, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"aenv {' '.join(args)} → {proc.returncode}: {proc.stderr.decode()}")
    return proc


@pytest.fixture(scope="module")
def tag() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def sandbox(tag: str) -> Iterator[str]:
    proc = aenv("start", TEMPLATE, "--detach", "--timeout", "600", "--metadata", f"clitest={tag}")
    sandbox_id = proc.stdout.decode().strip()
    assert sandbox_id and "\n" not in sandbox_id
    try:
        yield sandbox_id
    finally:
        aenv("rm", sandbox_id, check=False)


def test_exec_uname_runs_in_the_microvm(sandbox: str) -> None:
    proc = aenv("exec", sandbox, "--", "uname", "-a")
    host = os.uname()
    assert proc.stdout.startswith(b"Linux ")
    assert host.release.encode() not in proc.stdout


def test_exec_stdout_stderr_exit_code(sandbox: str) -> None:
    proc = aenv("exec", sandbox, "--", "echo out; echo err >&2; exit 7", check=False)
    assert proc.returncode == 7
    assert proc.stdout == b"out\n"
    assert proc.stderr == b"err\n"


def test_exec_args_env_cwd(sandbox: str) -> None:
    proc = aenv("exec", sandbox, "--cwd", "/tmp", "--env", "GREETING=hi there", "--",
                "sh", "-c", 'printf "%s|%s" "$GREETING" "$(pwd)"')  # fmt: skip
    assert proc.stdout == b"hi there|/tmp"


def test_exec_binary_output(sandbox: str) -> None:
    proc = aenv("exec", sandbox, "--", "head -c 100000 /dev/zero")
    assert proc.stdout == b"\0" * 100000


def test_ls_json_with_metadata_filter(sandbox: str, tag: str) -> None:
    proc = aenv("ls", "--output", "json", "--metadata", f"clitest={tag}")
    items = json.loads(proc.stdout)
    assert [s["sandboxID"] for s in items] == [sandbox]
    assert items[0]["state"] == "running"
    piped = json.loads(aenv("ls").stdout)  # JSON by default when not a TTY
    assert sandbox in {s["sandboxID"] for s in piped}


def test_timeout_changes_end(sandbox: str) -> None:
    def end_at() -> datetime:
        info = json.loads(aenv("info", sandbox).stdout)
        return datetime.fromisoformat(info["endAt"].replace("Z", "+00:00"))

    aenv("timeout", sandbox, "900")
    later = end_at()
    aenv("timeout", sandbox, "600")
    assert (later - end_at()).total_seconds() > 200


def test_upload_download_round_trip(sandbox: str, tmp_path: Path) -> None:
    src = tmp_path / "data.bin"
    src.write_bytes(os.urandom(300_000))
    aenv("upload", sandbox, str(src), "/tmp/aenv-cli-live.bin")
    proc = aenv("exec", sandbox, "--", "wc -c < /tmp/aenv-cli-live.bin")
    assert proc.stdout.strip() == b"300000"
    dest = tmp_path / "back.bin"
    aenv("download", sandbox, "/tmp/aenv-cli-live.bin", str(dest))
    assert dest.read_bytes() == src.read_bytes()


def test_pause_then_resume(sandbox: str) -> None:
    aenv("exec", sandbox, "--", "echo before > /tmp/aenv-cli-pause")
    assert aenv("pause", sandbox).stdout.decode().split() == [sandbox]
    assert json.loads(aenv("info", sandbox).stdout)["state"] == "paused"
    twice = aenv("pause", sandbox, check=False)
    assert twice.returncode == 1 and b"error: " in twice.stderr
    assert aenv("resume", sandbox, "--timeout", "600").stdout.decode().split() == [sandbox]
    assert json.loads(aenv("info", sandbox).stdout)["state"] == "running"
    assert aenv("exec", sandbox, "--", "cat /tmp/aenv-cli-pause").stdout == b"before\n"


def test_fork_prints_the_new_ids(sandbox: str) -> None:
    aenv("exec", sandbox, "--", "echo from-parent > /tmp/aenv-cli-fork")
    children = aenv("fork", sandbox, "--count", "2", "--timeout", "120").stdout.decode().split()
    try:
        assert len(children) == 2 and sandbox not in children
        for child in children:
            assert aenv("exec", child, "--", "cat /tmp/aenv-cli-fork").stdout == b"from-parent\n"
    finally:
        aenv("rm", *children, check=False)
    bad = aenv("fork", sandbox, "--count", "0", check=False)
    assert bad.returncode == 2


def test_snapshot_start_rollback_and_rm(sandbox: str) -> None:
    aenv("exec", sandbox, "--", "echo snapped > /tmp/aenv-cli-snap")
    snapshot = aenv("snapshot", "create", sandbox).stdout.decode().strip()
    listed = json.loads(aenv("snapshot", "ls", "--sandbox", sandbox, "-o", "json").stdout)
    assert [s["snapshotID"] for s in listed] == [snapshot]
    child = aenv("start", snapshot, "--detach", "--timeout", "120").stdout.decode().strip()
    try:
        assert aenv("exec", child, "--", "cat /tmp/aenv-cli-snap").stdout == b"snapped\n"
    finally:
        aenv("rm", child, check=False)
    aenv("exec", sandbox, "--", "echo later > /tmp/aenv-cli-snap")
    assert aenv("rollback", sandbox, snapshot).stdout.decode().split() == [sandbox]
    assert aenv("exec", sandbox, "--", "cat /tmp/aenv-cli-snap").stdout == b"snapped\n"
    # A filesystem pause, resumed: a fresh guest on the same disk.
    aenv("pause", sandbox, "--filesystem")
    assert json.loads(aenv("info", sandbox).stdout)["pauseMode"] == "filesystem"
    aenv("resume", sandbox, "--timeout", "600")
    assert aenv("exec", sandbox, "--", "cat /tmp/aenv-cli-snap").stdout == b"snapped\n"
    assert aenv("snapshot", "rm", snapshot).stdout.decode().split() == [snapshot]
    assert json.loads(aenv("snapshot", "ls", "--sandbox", sandbox, "-o", "json").stdout) == []


def test_rm_then_missing(tag: str) -> None:
    meta = f"clitest={tag}-rm"
    proc = aenv("start", TEMPLATE, "--detach", "--timeout", "120", "--metadata", meta)
    sandbox_id = proc.stdout.decode().strip()
    assert aenv("rm", sandbox_id).stdout.decode().split() == [sandbox_id]
    gone = aenv("info", sandbox_id, check=False)
    assert gone.returncode == 1
    assert gone.stderr.startswith(b"error: ")
    again = aenv("rm", sandbox_id, check=False)
    assert again.returncode == 1


def test_doctor_names_the_accelerator() -> None:
    proc = aenv("doctor", check=False)
    out = proc.stdout.decode()
    assert "accelerator: " in out, out
    assert proc.returncode == 0, out + proc.stderr.decode()
