"""`Sandbox.fork` with the unmodified E2B SDK: checkpoint in place, children from it."""

from __future__ import annotations

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from ..live import TEST_KEY, HostResources, LiveServer, wait_for

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]

# A process that keeps counting: in a fork it must still be running, from where it was.
TICKER = (
    "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/ticks; "
    "sleep 0.1; done' >/dev/null 2>&1 &"
)


def ticks(sandbox: Sandbox) -> int:
    return int(sandbox.commands.run("cat /tmp/ticks").stdout)


def test_forks_continue_from_the_checkpoint_and_diverge(server: LiveServer) -> None:
    before = HostResources.measure(server.home, server.prefix)
    parent = Sandbox.create(envs={"FROM_PARENT": "yes"}, metadata={"role": "parent"})
    children: list[Sandbox] = []
    try:
        parent.commands.run("echo parent > ~/state")
        parent.commands.run(TICKER)
        end_before = parent.get_info().end_at
        results = parent.fork(count=2, timeout=120)
        children = [r for r in results if isinstance(r, Sandbox)]
        assert len(children) == 2, results
        assert len({parent.sandbox_id, *(c.sandbox_id for c in children)}) == 3
        # The parent keeps its id and expiry, and runs on.
        assert parent.get_info().end_at == end_before
        assert parent.is_running()
        draws = set()
        for child in children:
            info = child.get_info()
            assert info.metadata == {"role": "parent"}
            # Disk, memory and processes as they were at the checkpoint, still running.
            assert child.commands.run("cat ~/state; echo $FROM_PARENT").stdout == "parent\nyes\n"
            first = ticks(child)
            # Still counting (two reads can fall inside one of its 0.1 s sleeps).
            assert wait_for(lambda child=child, first=first: ticks(child) > first, 10)
            draws.add(child.commands.run("head -c 16 /dev/urandom | od -An -tx1").stdout)
        assert len(draws) == 2  # each fork reseeded its random generator
        # Each one's disk is its own from here on.
        children[0].commands.run("echo first-child > ~/state")
        assert children[1].commands.run("cat ~/state").stdout == "parent\n"
        assert parent.commands.run("cat ~/state").stdout == "parent\n"
    finally:
        for sandbox in (parent, *children):
            sandbox.kill()
    assert HostResources.measure(server.home, server.prefix) == before


def test_only_running_sandboxes_fork(server: LiveServer) -> None:
    sandbox = Sandbox.create()
    try:
        sandbox.pause()
        with pytest.raises(SandboxException):
            Sandbox.fork(sandbox.sandbox_id, count=1)
    finally:
        sandbox.kill()
    with server.client(TEST_KEY) as api:
        assert api.post("/sandboxes/nope/fork", json={}).status_code == 404
        bad = api.post(f"/sandboxes/{sandbox.sandbox_id}/fork", json={"count": 101})
        assert bad.status_code == 400 and "count" in bad.json()["message"]


def test_a_secure_sandboxs_forks_get_their_own_tokens(server: LiveServer) -> None:
    # The SDK no longer sends `secure` (it is deprecated there), so ask the API directly.
    with server.client(TEST_KEY) as api:
        parent = api.post("/v2/sandboxes", json={"templateID": "base", "secure": True}).json()
        results = api.post(f"/sandboxes/{parent['sandboxID']}/fork", json={"count": 1}).json()
        child = results[0]["sandbox"]
        try:
            token = child["envdAccessToken"]
            assert token and token != parent["envdAccessToken"]

            def envs(sandbox_id: str, token: str) -> int:
                headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
                return api.get("/envs", headers=headers | {"X-Access-Token": token}).status_code

            assert envs(child["sandboxID"], token) == 200
            assert envs(child["sandboxID"], parent["envdAccessToken"]) == 401
            assert envs(parent["sandboxID"], parent["envdAccessToken"]) == 200
        finally:
            for sandbox in (parent, child):
                api.delete(f"/sandboxes/{sandbox['sandboxID']}")
