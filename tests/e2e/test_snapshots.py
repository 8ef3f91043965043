"""Snapshots with the unmodified E2B SDK on real VMs: take, list, start from, delete;
filesystem-only snapshots and pauses; a reboot on resume; rollback in place."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from agentenv.config import load_config
from agentenv.net.netns import list_namespaces
from agentenv.runtime.snapshots.servedram import ServedRam
from agentenv.storage.blockd import BlockdClient
from agentenv.storage.posix import PosixObjectStore

from ..live import TEST_KEY, HostResources, LiveServer
from ..vmfactory import VmFactory

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]

# A process that keeps counting: restored memory brings it back, a fresh guest does not.
TICKER = (
    "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/t; mv /tmp/t /tmp/ticks; "
    "sleep 0.1; done' >/dev/null 2>&1 &"
)


def ticks(sandbox: Sandbox) -> int | None:
    """The ticker's count, once it has moved on; None when no ticker runs."""
    out = sandbox.commands.run("cat /tmp/ticks 2>/dev/null || true").stdout.strip()
    if not out:
        return None
    time.sleep(0.3)
    later = int(sandbox.commands.run("cat /tmp/ticks").stdout)
    return later if later > int(out) else None


def test_snapshot_starts_sandboxes_that_keep_memory_and_disk(server: LiveServer) -> None:
    before = HostResources.measure(server.home, server.prefix)
    source = Sandbox.create(envs={"FROM_SOURCE": "yes"})
    made: list[Sandbox] = []
    try:
        source.commands.run("echo snap > ~/state && " + TICKER)
        snapshot = source.create_snapshot()
        name = snapshot.snapshot_id.split(":")[0]
        assert snapshot.names == [snapshot.snapshot_id, f"{name}:default"]
        assert source.is_running() and ticks(source)
        source.commands.run("echo after > ~/state")

        listed = Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()
        assert [s.snapshot_id for s in listed] == [snapshot.snapshot_id]

        for ref in (snapshot.snapshot_id, name):
            child = Sandbox.create(ref, envs={"EXTRA": "1"})
            made.append(child)
            assert child.sandbox_id != source.sandbox_id
            out = child.commands.run("cat ~/state; echo $FROM_SOURCE $EXTRA").stdout
            assert out == "snap\nyes 1\n"
            assert ticks(child) is not None  # the process came back with the memory

        # A name that exists gets a new build, and the name now means that one.
        again = source.create_snapshot(name=name)
        assert again.snapshot_id != snapshot.snapshot_id and again.snapshot_id.startswith(name)
        newest = Sandbox.create(name)
        made.append(newest)
        assert newest.commands.run("cat ~/state").stdout == "after\n"
        assert len(Sandbox.list_snapshots(name=name).next_items()) == 2

        assert Sandbox.delete_snapshot(snapshot.snapshot_id)
        # Sandboxes made from it keep their own copies.
        assert made[0].commands.run("cat ~/state").stdout == "snap\n"
        with pytest.raises(SandboxException, match="404"):
            Sandbox.create(snapshot.snapshot_id)
        assert Sandbox.delete_snapshot(name)
        assert not Sandbox.delete_snapshot(name)
    finally:
        for sandbox in (source, *made):
            sandbox.kill()
    assert HostResources.measure(server.home, server.prefix) == before


def test_filesystem_snapshots_and_pauses_start_a_fresh_guest(server: LiveServer) -> None:
    before = HostResources.measure(server.home, server.prefix)
    source = Sandbox.create()
    made: list[Sandbox] = []
    try:
        # Written but not synced by anyone: the filesystem snapshot flushes it.
        source.commands.run("echo kept > ~/state && " + TICKER)
        snapshot = source.create_snapshot(mode="filesystem")
        child = Sandbox.create(snapshot.snapshot_id)
        made.append(child)
        assert child.commands.run("cat ~/state").stdout == "kept\n"
        assert ticks(child) is None  # a fresh guest: no process of the source's

        source.pause(mode="filesystem")
        assert source.get_info().state.value == "paused"
        resumed = Sandbox.connect(source.sandbox_id)
        assert resumed.commands.run("cat ~/state").stdout == "kept\n"
        assert ticks(resumed) is None

        # A full pause, resumed by reboot: the disk is kept, the memory is not.
        resumed.commands.run(TICKER)
        resumed.pause()
        rebooted = Sandbox.connect(source.sandbox_id, on_resume="reboot")
        assert rebooted.commands.run("cat ~/state").stdout == "kept\n"
        assert ticks(rebooted) is None
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    finally:
        for sandbox in (source, *made):
            sandbox.kill()
    assert HostResources.measure(server.home, server.prefix) == before


def test_a_paused_sandbox_is_snapshotted_as_it_is(server: LiveServer) -> None:
    source = Sandbox.create()
    made: list[Sandbox] = []
    try:
        source.commands.run("echo paused-state > ~/state && " + TICKER)
        source.pause()
        snapshot = Sandbox.create_snapshot(source.sandbox_id)
        assert source.get_info().state.value == "paused"
        child = Sandbox.create(snapshot.snapshot_id)
        made.append(child)
        assert child.commands.run("cat ~/state").stdout == "paused-state\n"
        assert ticks(child) is not None
        # Paused without its memory, it has no memory to snapshot.
        resumed = Sandbox.connect(source.sandbox_id)
        resumed.pause(mode="filesystem")
        with pytest.raises(SandboxException, match="409"):
            Sandbox.create_snapshot(source.sandbox_id)
        on_disk = Sandbox.create_snapshot(source.sandbox_id, mode="filesystem")
        listed = Sandbox.list_snapshots(sandbox_id=source.sandbox_id).next_items()
        assert {each.snapshot_id for each in listed} == {
            snapshot.snapshot_id,
            on_disk.snapshot_id,
        }
        for each in (snapshot, on_disk):
            Sandbox.delete_snapshot(each.snapshot_id)
    finally:
        for sandbox in (source, *made):
            sandbox.kill()


def test_rollback_puts_a_sandbox_back_in_place(server: LiveServer) -> None:
    before = HostResources.measure(server.home, server.prefix)
    sandbox = Sandbox.create()
    api = httpx.Client(base_url=server.url, headers={"X-API-Key": TEST_KEY}, timeout=120)
    try:
        sandbox.commands.run("echo v1 > ~/state && " + TICKER)
        snapshot = sandbox.create_snapshot()
        sandbox.commands.run("echo v2 > ~/state && pkill -f '[w]hile :'; rm -f /tmp/ticks")
        body = {"snapshotID": snapshot.snapshot_id}
        for paused in (False, True):
            if paused:
                sandbox.commands.run("echo v3 > ~/state")
                sandbox.pause()
            r = api.post(f"/sandboxes/{sandbox.sandbox_id}/rollback", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["sandboxID"] == sandbox.sandbox_id
            # Same id and token: the SDK object made before keeps working.
            assert sandbox.commands.run("cat ~/state").stdout == "v1\n"
            assert ticks(sandbox) is not None
        r = api.post(f"/sandboxes/{sandbox.sandbox_id}/rollback", json={"snapshotID": "nope:x"})
        assert r.status_code == 404 and r.json()["code"] == 404
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    finally:
        api.close()
        sandbox.kill()
    assert HostResources.measure(server.home, server.prefix) == before


def _point_sdk(monkeypatch: pytest.MonkeyPatch, server: LiveServer) -> None:
    monkeypatch.setenv("E2B_API_URL", server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", server.url)


def _until_stored(server: LiveServer, sandbox_id: str, snapshot_id: str) -> None:
    deadline = time.monotonic() + 120
    with server.client() as api:
        while time.monotonic() < deadline:
            sandbox = api.get(f"/sandboxes/{sandbox_id}").json()
            snapshots = api.get("/snapshots", params={"name": snapshot_id}).json()
            if sandbox.get("storage") == "stored" and snapshots[0]["status"] == "stored":
                return
            time.sleep(0.5)
    raise AssertionError(f"not stored in time: {sandbox} {snapshots}")


def test_a_new_node_resumes_what_a_lost_node_left(
    kit_ready: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vms: VmFactory
) -> None:
    """A node's home is deleted; a node with an empty home and the same state and object
    stores resumes its paused sandbox and starts sandboxes from its snapshot, memory,
    processes and disk intact."""
    shared = tmp_path / "shared"
    env = {
        "AENV_STATE_URL": f"sqlite:///{shared / 'state.db'}",
        "AENV_STORAGE_POSIX_ROOT": str(shared / "objects"),
        "E2B_API_KEY": TEST_KEY,
    }
    monkeypatch.setenv("E2B_API_KEY", TEST_KEY)
    lost = vms.own(LiveServer(tmp_path / "lost", extra_env=env))
    lost.home.mkdir()
    new = vms.own(LiveServer(tmp_path / "new", extra_env=env))
    new.home.mkdir()
    lost.start()
    _point_sdk(monkeypatch, lost)
    sandbox = Sandbox.create()
    sandbox.commands.run(
        "echo disk > ~/state && head -c 3000000 /dev/urandom > ~/blob && "
        "sha256sum ~/blob > ~/blob.sum && " + TICKER
    )
    # A secret held only in a process's memory.
    sandbox.commands.run(
        'nohup python3 -c "import time,os; s=os.urandom(8).hex(); '
        "open('/tmp/secret','w').write(s); time.sleep(1e6)\" "
        ">/dev/null 2>&1 &"
    )
    # Python starts slowly under TCG on a busy host: wait for the file, not a fixed time.
    secret = sandbox.commands.run(
        "timeout 60 sh -c 'until [ -s /tmp/secret ]; do sleep 0.1; done'; cat /tmp/secret"
    ).stdout
    snapshot = sandbox.create_snapshot()
    sandbox.pause()
    _until_stored(lost, sandbox.sandbox_id, snapshot.snapshot_id)
    lost.stop()
    BlockdClient(load_config(env=lost.env)).stop()
    for netns in list_namespaces(lost.prefix):
        subprocess.run(["ip", "netns", "del", netns], check=False)
    shutil.rmtree(lost.home)

    new.start()
    _point_sdk(monkeypatch, new)
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert resumed.commands.run("cat ~/state; sha256sum -c ~/blob.sum").exit_code == 0
    assert resumed.commands.run("cat /tmp/secret").stdout == secret
    assert ticks(resumed) is not None
    assert resumed.commands.run("pgrep -f time.sleep").exit_code == 0
    child = Sandbox.create(snapshot.snapshot_id)
    assert child.commands.run("cat ~/state").stdout == "disk\n"
    assert ticks(child) is not None
    # Neither RAM was fetched: both map what the new node's block daemon serves.
    served = BlockdClient(load_config(env=new.env)).paths.mnt
    for sid in (sandbox.sandbox_id, child.sandbox_id):
        base = new.home / "sandboxes" / sid / "memory.base"
        assert base.is_symlink() and base.readlink().parent == served
    # Paused again over the served base (its delta saved), stored, and resumed.
    resumed.pause()
    _until_stored(new, sandbox.sandbox_id, snapshot.snapshot_id)
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert resumed.commands.run("cat /tmp/secret").stdout == secret
    assert resumed.commands.run("sha256sum -c ~/blob.sum").exit_code == 0


def test_the_collector_keeps_what_is_used_and_deletes_the_rest(
    fresh_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh_server.start()
    _point_sdk(monkeypatch, fresh_server)
    monkeypatch.setenv("E2B_API_KEY", TEST_KEY)
    objects = fresh_server.home / "objects"

    def layers() -> set[str]:
        return {p.name for p in (objects / "layers").glob("*.json")}

    kept, dropped = Sandbox.create(), Sandbox.create()
    for sandbox in (kept, dropped):
        sandbox.commands.run("head -c 5M /dev/urandom > ~/data && " + TICKER)
    snapshot = kept.create_snapshot()
    for sandbox in (kept, dropped):
        sandbox.pause()
        _until_stored(fresh_server, sandbox.sandbox_id, snapshot.snapshot_id)
    with fresh_server.client() as api:
        assert api.post("/gc", json={"graceSeconds": 0}).json()["layers"] == 0
        used = layers()
        # What only the snapshot used may go with it (layers the kept sandbox's uploads
        # share with it or sit on stay: it resumes from them below).
        Sandbox.delete_snapshot(snapshot.snapshot_id)
        api.post("/gc", json={"graceSeconds": 0})
        used = layers()
        dropped.kill()
        report = api.post("/gc", json={"graceSeconds": 0}).json()
        assert report["layers"] > 0 and layers() < used
        # What the kept one needs is all there: it resumes from the store's copy.
        shutil.rmtree(fresh_server.home / "sandboxes" / kept.sandbox_id)
        resumed = Sandbox.connect(kept.sandbox_id)
        assert ticks(resumed) is not None
        resumed.kill()
        # Its RAM was served by the block daemon; two sweeps find nothing links it.
        served = ServedRam(
            BlockdClient(load_config(env=fresh_server.env)),
            PosixObjectStore(objects),
            [fresh_server.home / "sandboxes", fresh_server.home / "snapshots"],
        )
        assert served.sweep() + served.sweep() == 1
        api.post("/gc", json={"graceSeconds": 0})
        assert layers() == set()
        assert list((objects / "chunks").glob("*")) == []
        assert api.post("/gc", json={"graceSeconds": -1}).status_code == 400
