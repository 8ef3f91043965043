"""Sandboxes restored from a boot snapshot: same behaviour as booted ones, distinct clones."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ..live import HostResources, LiveServer, boot_snapshot, wait_for
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import kill, run

pytestmark = pytest.mark.vm


def console(server: LiveServer, sandbox_id: str) -> str:
    return (server.home / "sandboxes" / sandbox_id / "console.log").read_text(errors="replace")


def restored(server: LiveServer, sandbox_id: str) -> bool:
    # A restored guest never boots: its console starts after the kernel and /init ran.
    return "aenv: agent starting" not in console(server, sandbox_id)


def test_restored_sandboxes_work_and_diverge(server: LiveServer, vms: VmFactory) -> None:
    assert wait_for(lambda: boot_snapshot(server, 256) is not None, 180)
    first, second = vms.create(server), vms.create(server)
    for sandbox in (first, second):
        assert restored(server, sandbox["sandboxID"])
        out, _, code = run(server, sandbox, "cat /etc/debian_version; hostname; whoami")
        assert code == 0 and out.splitlines()[1:] == ["sandbox", "user"], out
        clock, _, _ = run(server, sandbox, "date +%s")
        assert abs(int(clock) - time.time()) < 10
        assert run(server, sandbox, "echo data > ~/mine; cat ~/mine")[0] == "data\n"
    # Clones of one snapshot share the kernel's random state until /init reseeds it.
    draw = "head -c 16 /dev/urandom | od -An -tx1"
    draws = [run(server, sandbox, draw)[0] for sandbox in (first, second)]
    assert draws[0] != draws[1]
    # Each clone has its own disk: what one writes, the other does not see.
    run(server, first, "echo only-first > ~/first")
    assert run(server, second, "test -e ~/first && echo yes || echo no")[0] == "no\n"


def test_broken_snapshot_falls_back_to_boot_and_is_rebuilt(
    fresh_server: LiveServer, vms: VmFactory
) -> None:
    # A VM shape of its own, so the shared snapshot other tests use is left alone.
    fresh_server.extra_env["AENV_SANDBOX_MEMORY_MB"] = "288"
    fresh_server.start()
    assert wait_for(lambda: boot_snapshot(fresh_server, 288) is not None, 180)
    broken = boot_snapshot(fresh_server, 288)
    assert broken is not None
    (broken / "vmstate").write_bytes(b"not a migration stream")
    before = HostResources.measure(fresh_server.home, fresh_server.prefix)
    sandbox = vms.create(fresh_server)
    sandbox_id = sandbox["sandboxID"]
    assert not restored(fresh_server, sandbox_id)
    assert run(fresh_server, sandbox, "echo booted")[0] == "booted\n"
    assert "restore of" in fresh_server.log_tail(20000)
    kill(fresh_server, sandbox_id)
    assert HostResources.measure(fresh_server.home, fresh_server.prefix) == before
    # The next create asks for the snapshot again; it is rebuilt and then used.
    second = vms.create(fresh_server)
    kill(fresh_server, second["sandboxID"])
    assert wait_for(lambda: boot_snapshot(fresh_server, 288) is not None, 180)
    third = vms.create(fresh_server)
    assert restored(fresh_server, third["sandboxID"])
    assert not list(Path("/run/netns").glob("aenvsnap-*"))
