"""Fault injection: the server dies (SIGKILL) at each step of create, pause, resume and
fork; after a restart every sandbox is running and answering, paused at a complete state
that resumes intact, or gone, and nothing is left behind."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx
import pytest

from ..live import HostResources, LiveServer
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import run

pytestmark = pytest.mark.vm

# A process that keeps counting: after any crash it runs on from where it was, or is gone.
COUNTER = (
    "setsid nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; "
    "mv /tmp/c.new /tmp/count; sleep 0.1; done' >/dev/null 2>&1 &"
)


def count(server: LiveServer, sandbox: dict[str, Any]) -> int:
    return int(run(server, sandbox, "cat /tmp/count")[0])


def start_counting(server: LiveServer, sandbox: dict[str, Any]) -> int:
    run(server, sandbox, COUNTER)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        out, _, code = run(server, sandbox, "cat /tmp/count 2>/dev/null")
        if code == 0 and int(out or 0) >= 3:
            return int(out)
        time.sleep(0.2)
    raise AssertionError("the counter never started")


def restart(server: LiveServer, crash_at: str | None = None) -> None:
    """Start the server again (it died), optionally set to die at `crash_at`."""
    if server.proc is not None:
        server.proc.wait(timeout=60)
        server.proc = None
    server.extra_env.pop("AENV_CRASH_AT", None)
    if crash_at:
        server.extra_env["AENV_CRASH_AT"] = crash_at
    server.start()


def call_until_crash(server: LiveServer, method: str, path: str, body: dict) -> None:
    """The request whose handling reaches the crash point: the server must die of it; it
    is then started again (recovering)."""
    assert server.proc is not None
    with server.client() as api:
        with pytest.raises(httpx.TransportError):
            api.request(method, path, json=body)
    assert server.proc.wait(timeout=60) == -signal.SIGKILL, server.log_tail()
    server.proc = None
    restart(server)


def settled(
    server: LiveServer,
    known: dict[str, dict[str, Any]],
    floor: int,
    *,
    snapshots: int = 0,
    counting: bool = True,
) -> dict[str, str]:
    """Each sandbox's state after recovery, each checked: a running one answers and its
    counter goes on from at least `floor`; a paused one resumes and does the same (a
    fresh guest after a filesystem pause, not `counting`, keeps its count on disk only).
    Host resources are each sandbox's, and `snapshots` snapshots' files."""
    with server.client() as api:
        listed = {s["sandboxID"]: s for s in api.get("/v2/sandboxes").json()}
    states: dict[str, str] = {}
    for sid, entry in listed.items():
        sandbox = known.get(sid)
        if sandbox is None:  # a fork finished before the crash: its token is in its details
            with server.client() as api:
                sandbox = api.get(f"/sandboxes/{sid}").json()
        if entry["state"] == "paused":
            with server.client() as api:
                resumed = api.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 120})
            assert resumed.status_code == 201, resumed.text
            sandbox = {**sandbox, **resumed.json()}
        first = count(server, sandbox)
        assert first >= floor, (sid, first, floor)
        if counting:
            time.sleep(0.5)
            assert count(server, sandbox) > first, f"{sid}: the counter stopped"
        states[sid] = entry["state"]
    expected = HostResources(
        vmms=len(listed), namespaces=len(listed), links=len(listed), workdirs=len(listed),
        mounts=0, sockets=len(listed), checkpoints=0, snapshots=snapshots,
    )  # fmt: skip
    assert server.resources() == expected
    return states


def kill_all(server: LiveServer, sandbox_ids: list[str]) -> None:
    with server.client() as api:
        for sid in sandbox_ids:
            api.delete(f"/sandboxes/{sid}")
    assert server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize(
    "point",
    ["create.recorded", "create.network", "create.vm", "create.initialized", "create.provisioned"],
)
def test_crash_during_create_leaves_nothing(fresh_server: LiveServer, point: str) -> None:
    restart(fresh_server, crash_at=point)
    call_until_crash(fresh_server, "POST", "/v2/sandboxes", {"templateID": "base"})
    assert settled(fresh_server, {}, 0) == {}


def counting_sandbox(server: LiveServer, vms: VmFactory) -> tuple[dict[str, Any], int]:
    """The server (re)started, and a sandbox on it whose counter runs: it, and the floor."""
    restart(server)
    sandbox = vms.create(server)
    return sandbox, start_counting(server, sandbox)


def arm(server: LiveServer, point: str) -> None:
    """Restart the server set to die at `point` (the VMs run on meanwhile)."""
    server.stop()
    restart(server, crash_at=point)


def paused_with_counter(server: LiveServer, vms: VmFactory) -> tuple[dict[str, Any], int]:
    sandbox, floor = counting_sandbox(server, vms)
    with server.client() as api:
        assert api.post(f"/sandboxes/{sandbox['sandboxID']}/pause", json={}).status_code == 204
    return sandbox, floor


@pytest.mark.parametrize(
    ("point", "outcome"),
    [("pause.begun", "running"), ("pause.saved", "paused"), ("pause.stopped", "paused")],
)
def test_crash_during_pause(
    fresh_server: LiveServer, vms: VmFactory, point: str, outcome: str
) -> None:
    sandbox, floor = counting_sandbox(fresh_server, vms)
    sid = sandbox["sandboxID"]
    arm(fresh_server, point)
    call_until_crash(fresh_server, "POST", f"/sandboxes/{sid}/pause", {})
    assert settled(fresh_server, {sid: sandbox}, floor) == {sid: outcome}
    kill_all(fresh_server, [sid])


@pytest.mark.parametrize(
    ("point", "outcome"),
    [
        ("resume.begun", "paused"),
        # The saved state is consumed: the guest lives on in its recorded VM only.
        ("resume.consumed", "running"),
        ("resume.restored", "running"),
        ("resume.initialized", "running"),
    ],
)
def test_crash_during_resume(
    fresh_server: LiveServer, vms: VmFactory, point: str, outcome: str
) -> None:
    sandbox, floor = paused_with_counter(fresh_server, vms)
    sid = sandbox["sandboxID"]
    arm(fresh_server, point)
    call_until_crash(fresh_server, "POST", f"/v2/sandboxes/{sid}/connect", {"timeout": 120})
    assert settled(fresh_server, {sid: sandbox}, floor) == {sid: outcome}
    kill_all(fresh_server, [sid])


@pytest.mark.parametrize(
    "point",
    [
        "checkpoint.begun",
        "checkpoint.frozen",
        "checkpoint.copied",
        "create.provisioned",
        "fork.children",
    ],
)
def test_crash_during_fork(fresh_server: LiveServer, vms: VmFactory, point: str) -> None:
    parent, floor = counting_sandbox(fresh_server, vms)
    sid = parent["sandboxID"]
    arm(fresh_server, point)
    call_until_crash(fresh_server, "POST", f"/sandboxes/{sid}/fork", {"count": 2})
    states = settled(fresh_server, {sid: parent}, floor)
    # The parent always runs on; forks finished before the crash are sandboxes like any.
    assert states[sid] == "running"
    if point != "fork.children":
        assert list(states) == [sid]
    kill_all(fresh_server, list(states))


@pytest.mark.parametrize("operation", ["pause", "fork"])
def test_sigkill_swept_over_an_operation(
    fresh_server: LiveServer, vms: VmFactory, operation: str
) -> None:
    """A timed SIGKILL at several delays into the operation, whatever step that is."""
    sandbox, floor = counting_sandbox(fresh_server, vms)
    sid = sandbox["sandboxID"]
    for delay in (0.0, 0.01, 0.02, 0.04, 0.08):
        path = f"/sandboxes/{sid}/pause" if operation == "pause" else f"/sandboxes/{sid}/fork"
        threading.Timer(delay, fresh_server.proc.send_signal, (signal.SIGKILL,)).start()
        with fresh_server.client() as api, pytest.raises(httpx.TransportError):
            # If the operation beats the signal, the next one surely does not.
            for _ in range(3):
                api.post(path, json={})
                if operation == "pause":
                    api.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 120})
        restart(fresh_server)
        states = settled(fresh_server, {sid: sandbox}, floor)
        assert states.get(sid) in ("running", "paused"), (delay, states)
        with fresh_server.client() as api:
            for fork in set(states) - {sid}:
                api.delete(f"/sandboxes/{fork}")
    kill_all(fresh_server, [sid])


def _snapshot(server: LiveServer, sid: str, body: dict[str, Any] | None = None) -> str:
    with server.client() as api:
        answer = api.post(f"/sandboxes/{sid}/snapshots", json=body or {})
    assert answer.status_code == 201, answer.text
    return answer.json()["snapshotID"]


def _no_snapshots_left(server: LiveServer) -> None:
    with server.client() as api:
        for snapshot in api.get("/snapshots").json():
            assert api.delete(f"/templates/{snapshot['snapshotID']}").status_code == 204
    assert server.resources().snapshots == 0


@pytest.mark.parametrize("point", ["checkpoint.frozen", "snapshot.copied", "snapshot.placed"])
def test_crash_during_snapshot(fresh_server: LiveServer, vms: VmFactory, point: str) -> None:
    """The source runs on; a snapshot is recorded whole or not at all, no files left."""
    sandbox, floor = counting_sandbox(fresh_server, vms)
    sid = sandbox["sandboxID"]
    arm(fresh_server, point)
    call_until_crash(fresh_server, "POST", f"/sandboxes/{sid}/snapshots", {})
    assert settled(fresh_server, {sid: sandbox}, floor) == {sid: "running"}
    with fresh_server.client() as api:
        assert api.get("/snapshots").json() == []
    assert fresh_server.resources().snapshots == 0
    kill_all(fresh_server, [sid])


@pytest.mark.parametrize(
    ("point", "outcome"),
    [
        ("rollback.committed", "paused"),
        ("rollback.applied", "paused"),
        ("resume.restored", "running"),
    ],
)
def test_crash_during_rollback(
    fresh_server: LiveServer, vms: VmFactory, point: str, outcome: str
) -> None:
    """Once committed, a rollback ends paused at its snapshot or running from it."""
    sandbox, floor = counting_sandbox(fresh_server, vms)
    sid = sandbox["sandboxID"]
    snapshot = _snapshot(fresh_server, sid)
    arm(fresh_server, point)
    call_until_crash(fresh_server, "POST", f"/sandboxes/{sid}/rollback", {"snapshotID": snapshot})
    assert settled(fresh_server, {sid: sandbox}, floor, snapshots=1) == {sid: outcome}
    _no_snapshots_left(fresh_server)
    kill_all(fresh_server, [sid])


@pytest.mark.parametrize(
    ("point", "outcome"), [("pause.begun", "running"), ("pause.stopped", "paused")]
)
def test_crash_during_a_filesystem_pause(
    fresh_server: LiveServer, vms: VmFactory, point: str, outcome: str
) -> None:
    sandbox, floor = counting_sandbox(fresh_server, vms)
    sid = sandbox["sandboxID"]
    arm(fresh_server, point)
    call_until_crash(fresh_server, "POST", f"/sandboxes/{sid}/pause", {"memory": False})
    # A fresh guest after a filesystem pause: its counter file on disk, no counter running.
    counting = outcome == "running"
    assert settled(fresh_server, {sid: sandbox}, floor, counting=counting) == {sid: outcome}
    kill_all(fresh_server, [sid])


def test_crash_during_an_upload(fresh_server: LiveServer, vms: VmFactory) -> None:
    """The server dies after an upload wrote its layers but before recording them: the
    sandbox stays paused and the upload is done again."""
    sandbox, floor = paused_with_counter(fresh_server, vms)
    sid = sandbox["sandboxID"]
    arm(fresh_server, "upload.stored")
    assert fresh_server.proc is not None
    assert fresh_server.proc.wait(timeout=120) == -signal.SIGKILL, fresh_server.log_tail()
    fresh_server.proc = None
    restart(fresh_server)
    deadline = time.monotonic() + 120
    with fresh_server.client() as api:
        while api.get(f"/sandboxes/{sid}").json().get("storage") != "stored":
            assert time.monotonic() < deadline, "never stored"
            time.sleep(0.5)
    assert settled(fresh_server, {sid: sandbox}, floor) == {sid: "paused"}
    kill_all(fresh_server, [sid])
