"""The warm pool: VMs started ahead of demand, taken by a matching create, refilled, and
gone without a trace when the server stops or dies."""

from __future__ import annotations

import signal

import pytest

from ..live import HostResources, LiveServer, boot_snapshot, wait_for
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import kill, run

pytestmark = pytest.mark.vm


def _warm_ids(server: LiveServer) -> set[str]:
    """Work directories with a VMM that no listed sandbox owns: the warm VMs."""
    with server.client() as api:
        listed = {s["sandboxID"] for s in api.get("/v2/sandboxes").json()}
    sandboxes = server.home / "sandboxes"
    present = {p.name for p in sandboxes.iterdir()} if sandboxes.exists() else set()
    return present - listed


def _start_with_pool(server: LiveServer, size: int) -> HostResources:
    """Start `server` with a warm pool of `size` and wait until it is full; the host's
    resources before it started."""
    baseline = HostResources.measure(server.home, server.prefix)
    server.extra_env["AENV_SANDBOX_WARM_POOL"] = str(size)
    server.start()
    assert wait_for(lambda: boot_snapshot(server, 256) is not None, 180)
    assert wait_for(lambda: server.resources().vmms == size, 120)
    return baseline


def test_a_create_takes_a_warm_vm_and_the_pool_refills(
    fresh_server: LiveServer, vms: VmFactory
) -> None:
    baseline = _start_with_pool(fresh_server, 2)
    warm = _warm_ids(fresh_server)
    assert len(warm) == 2
    # Nothing of the pool is a sandbox: not listed, not found.
    with fresh_server.client() as api:
        assert api.get(f"/sandboxes/{next(iter(warm))}").status_code == 404

    sandbox = vms.create(fresh_server, envVars={"FROM": "request"}, allow_internet_access=False)
    sid = sandbox["sandboxID"]
    assert sid in warm  # its VM was already running when the request came
    out, _, code = run(fresh_server, sandbox, "echo $FROM; cat /proc/uptime")
    assert code == 0 and out.splitlines()[0] == "request"
    # The pool fills up again beside the sandbox. A refill's work directory appears
    # before its VMM starts, so wait for both.
    assert wait_for(
        lambda: len(_warm_ids(fresh_server)) == 2 and fresh_server.resources().vmms == 3, 120
    )
    kill(fresh_server, sid)

    # Stopped, the server takes its warm VMs with it.
    fresh_server.stop()
    assert HostResources.measure(fresh_server.home, fresh_server.prefix) == baseline


def test_a_dead_servers_warm_vms_are_reclaimed(fresh_server: LiveServer) -> None:
    baseline = _start_with_pool(fresh_server, 1)
    assert fresh_server.proc is not None
    fresh_server.proc.send_signal(signal.SIGKILL)
    fresh_server.proc.wait()
    fresh_server.proc = None
    fresh_server.extra_env["AENV_SANDBOX_WARM_POOL"] = "0"
    fresh_server.start()
    assert wait_for(
        lambda: HostResources.measure(fresh_server.home, fresh_server.prefix) == baseline, 30
    )
