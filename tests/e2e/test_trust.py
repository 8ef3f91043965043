"""Trust on real VMs: the agent's /init is the host's alone, and admission counts what
sandboxes were promised, not what they use now."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from agentenv.runtime.memory.admission import total_memory_mb
from agentenv.wire import ENVD_PORT

from ..live import HostResources, LiveServer
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import kill, run

pytestmark = pytest.mark.vm


def namespace_address(server: LiveServer, sandbox_id: str) -> str:
    """The host's way to a sandbox: its namespace's veth address (the proxy's upstream)."""
    netns = f"{server.prefix}-{sandbox_id}"
    out = subprocess.run(
        ["ip", "-n", netns, "-o", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    for line in out.splitlines():
        fields = line.split()
        if fields[1].startswith(server.prefix):
            return fields[3].split("/")[0]
    raise AssertionError(f"no veth address in {netns}: {out}")


def test_init_needs_the_hosts_secret(server: LiveServer, vms: VmFactory) -> None:
    """Neither a host process nor the sandbox's owner (through the proxy, with its token)
    can call /init: it would set the token, env vars and default user."""
    sandbox = vms.create(server)
    sid, token = sandbox["sandboxID"], sandbox["envdAccessToken"]
    steal = {"accessToken": "thief", "defaultUser": "root", "envVars": {"X": "1"}}
    direct = f"http://{namespace_address(server, sid)}:{ENVD_PORT}/init"
    assert httpx.post(direct, json=steal).status_code == 401
    with server.client() as api:
        proxied = api.post(
            "/init", json=steal, headers={"E2b-Sandbox-Id": sid, "X-Access-Token": token}
        )
    assert proxied.status_code == 401
    # Nothing changed: the owner's token still works, the default user is still `user`.
    assert run(server, sandbox, "whoami; echo ${X:-unset}")[0] == "user\nunset\n"
    kill(server, sid)


def test_admission_counts_committed_memory(fresh_server: LiveServer, vms: VmFactory) -> None:
    """Room for one 256 MiB guest: a second is refused until the first is paused, and the
    first cannot resume while the second holds the memory."""
    room = (total_memory_mb() - 512) / 400  # one 256 MiB sandbox fits, two do not
    fresh_server.extra_env["AENV_SANDBOX_MEMORY_OVERCOMMIT"] = f"{1 / room:.9f}"
    fresh_server.extra_env["AENV_SANDBOX_ADMISSION_WAIT"] = "0.5"
    fresh_server.start()
    first = vms.create(fresh_server)
    with fresh_server.client() as api:
        refused = api.post("/v2/sandboxes", json={"templateID": "base"})
        assert refused.status_code == 429
        assert "not enough host memory: sandboxes hold 256 MiB" in refused.json()["message"]
        assert len(api.get("/v2/sandboxes").json()) == 1
        assert api.post(f"/sandboxes/{first['sandboxID']}/pause", json={}).status_code == 204
    second = vms.create(fresh_server)
    with fresh_server.client() as api:
        resumed = api.post(f"/v2/sandboxes/{first['sandboxID']}/connect", json={})
        assert resumed.status_code == 429, resumed.text
        assert api.get(f"/sandboxes/{first['sandboxID']}").json()["state"] == "paused"
    kill(fresh_server, second["sandboxID"])
    with fresh_server.client() as api:
        resumed = api.post(f"/v2/sandboxes/{first['sandboxID']}/connect", json={})
        assert resumed.status_code == 201, resumed.text
    kill(fresh_server, first["sandboxID"])
    assert fresh_server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)


def test_more_vcpus_than_the_host_has_is_refused(fresh_server: LiveServer) -> None:
    fresh_server.extra_env["AENV_SANDBOX_VCPUS"] = "64"
    fresh_server.start()
    with fresh_server.client() as api:
        refused = api.post("/v2/sandboxes", json={"templateID": "base"})
        assert refused.status_code == 503
        assert "vCPUs here, 64 asked" in refused.json()["message"]
        assert api.get("/v2/sandboxes").json() == []
    assert fresh_server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)
