"""Volumes with the unmodified SDK's `Volume` against a live server: create, find, list,
the content API with the volume's token, delete; and mounted into sandboxes (real VMs,
the node's NFS server) across pause and resume, and closed to sandboxes that do not
mount them."""

from __future__ import annotations

import subprocess
import time

import httpx
import pytest
from e2b import Sandbox, Volume
from e2b.exceptions import VolumePathNotFoundException

from ..live import LiveServer
from .test_sandbox_lifecycle import run

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]


@pytest.fixture(autouse=True)
def volume_api(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_VOLUME_API_URL", server.url)


def test_a_volume_and_its_files(server: LiveServer) -> None:
    name = f"data-{time.time_ns()}"
    volume = Volume.create(name)
    try:
        assert volume.token and volume.name == name
        assert name in [v.name for v in Volume.list()]
        again = Volume.connect(volume.volume_id)
        assert again.token == volume.token
        volume.make_dir("/models/small", force=True)
        volume.write_file("/models/small/weights.bin", b"\x00\x01" * 1000)
        assert volume.read_file("/models/small/weights.bin", format="bytes") == b"\x00\x01" * 1000
        assert [e.name for e in volume.list("/models", depth=2)] == ["small", "weights.bin"]
        info = volume.get_info("/models/small/weights.bin")
        assert (info.size, info.type.value) == (2000, "file")
        volume.update_metadata("/models/small/weights.bin", mode=0o600)
        assert volume.get_info("/models/small/weights.bin").mode == 0o600
        assert volume.exists("/models") and not volume.exists("/nothing")
        volume.remove("/models")
        with pytest.raises(VolumePathNotFoundException):
            volume.read_file("/models/small/weights.bin")
        # The token is the credential: another's, or none, opens nothing.
        url = f"{server.url}/volumecontent/{volume.volume_id}/dir"
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            assert httpx.get(url, params={"path": "/"}, headers=headers).status_code == 401
        # A mount of a volume that does not exist, or over the guest's system, is refused.
        with pytest.raises(Exception, match="not found"):
            Sandbox.create(volume_mounts={"/mnt/data": "no-such-volume"})
        with pytest.raises(Exception, match="cannot be mounted"):
            Sandbox.create(volume_mounts={"/usr": volume})
        with pytest.raises(Exception, match="already exists"):
            Volume.create(name)
    finally:
        Volume.destroy(volume.volume_id)
    assert name not in [v.name for v in Volume.list()]
    assert not (server.home / "volumes" / volume.volume_id).exists()


# What a hostile guest would try: the volume of another sandbox, over the gateway's NFS port.
_FOREIGN_MOUNT = """
import ctypes, os
os.makedirs("/tmp/theirs", exist_ok=True)
libc = ctypes.CDLL(None, use_errno=True)
options = ("vers=3,proto=tcp,port=2049,mountproto=tcp,mountport=2049,nolock,"
           "addr=169.254.0.22,mountaddr=169.254.0.22,retry=0,timeo=20,retrans=1,soft")
result = libc.mount(b"169.254.0.22:/{volume}", b"/tmp/theirs", b"nfs", 0, options.encode())
print(result, ctypes.get_errno())
"""


def test_a_volume_mounted_into_sandboxes(server: LiveServer) -> None:
    volume = Volume.create(f"mounted-{time.time_ns()}")
    other = Volume.create(f"other-{time.time_ns()}")
    sandboxes: list[Sandbox] = []
    try:
        volume.write_file("/hello.txt", b"from the API")
        sbx = Sandbox.create(volume_mounts={"/mnt/data": volume})
        sandboxes.append(sbx)
        assert sbx.commands.run("cat /mnt/data/hello.txt").stdout == "from the API"
        # The SDK's default user writes there; the content API sees it at once.
        sbx.files.write("/mnt/data/from-guest.txt", "written in the sandbox")
        assert volume.read_file("/from-guest.txt", format="bytes") == b"written in the sandbox"
        assert volume.get_info("/from-guest.txt").uid == 1000

        # A guest's symlinks and device nodes never take the content API off the volume.
        sbx.commands.run(
            "ln -s / /mnt/data/root && mknod /mnt/data/disk b 8 0 && mkfifo /mnt/data/fifo",
            user="root",
        )
        assert volume.get_info("/root").type.value == "symlink"
        for path in ("/root/etc/hostname", "/disk", "/fifo"):
            with pytest.raises(VolumePathNotFoundException):
                volume.read_file(path)

        # A fork's guest keeps the mount, from an address of its own.
        child = sbx.fork(count=1, timeout=120)[0]
        assert isinstance(child, Sandbox), child
        sandboxes.append(child)
        assert child.get_info().volume_mounts == [{"name": volume.name, "path": "/mnt/data"}]
        child.files.write("/mnt/data/from-fork.txt", "the fork's")
        assert volume.read_file("/from-fork.txt", format="bytes") == b"the fork's"

        # Paused and resumed, the guest's mount carries on.
        sbx.pause()
        sbx = Sandbox.connect(sbx.sandbox_id)
        sbx.files.write("/mnt/data/after-resume.txt", "still mounted")
        assert volume.read_file("/after-resume.txt", format="bytes") == b"still mounted"

        # Another sandbox mounting another volume cannot mount this one; one mounting
        # nothing cannot reach the NFS server at all.
        theirs = Sandbox.create(volume_mounts={"/mnt/other": other})
        sandboxes.append(theirs)
        script = _FOREIGN_MOUNT.format(volume=volume.volume_id)
        result = theirs.commands.run(f"python3 -c '{script}'", user="root")
        assert result.stdout.split()[0] == "-1", result.stdout
        assert theirs.commands.run("ls /mnt/other").stdout == ""
        plain = Sandbox.create()
        sandboxes.append(plain)
        probe = plain.commands.run(
            "timeout 5 bash -c '</dev/tcp/169.254.0.22/2049' && echo open || echo closed"
        )
        assert probe.stdout.strip() == "closed"

        # The volume outlives its sandboxes.
        for sandbox in sandboxes:
            sandbox.kill()
        sandboxes.clear()
        assert volume.read_file("/from-guest.txt", format="bytes") == b"written in the sandbox"
    finally:
        for sandbox in sandboxes:
            sandbox.kill()
        Volume.destroy(volume.volume_id)
        Volume.destroy(other.volume_id)


def test_a_mount_outlives_a_crash_of_the_server(fresh_server: LiveServer) -> None:
    """SIGKILL leaves the guest's mount and the NFS server; the restarted node replaces
    the server and the guest's writes go on."""
    fresh_server.start()
    with fresh_server.client() as api:
        volume = api.post("/volumes", json={"name": "crash"}).json()
        made = api.post(
            "/sandboxes",
            json={"templateID": "base", "volumeMounts": [{"name": "crash", "path": "/data"}]},
        )
        assert made.status_code == 201, made.text
        sandbox = made.json()
    try:
        assert run(fresh_server, sandbox, "echo before > /data/f && cat /data/f")[0] == "before\n"
        assert fresh_server.proc is not None
        fresh_server.proc.kill()
        fresh_server.proc.wait()
        fresh_server.proc = None
        fresh_server.start()
        out, _, code = run(fresh_server, sandbox, "echo after >> /data/f && cat /data/f")
        assert (out, code) == ("before\nafter\n", 0)
        # One NFS server: the crashed node's was replaced, not joined.
        servers = subprocess.run(
            ["ip", "netns", "pids", f"{fresh_server.prefix}nfs"], capture_output=True, text=True
        ).stdout.split()
        assert len(servers) == 2  # ganesha and its rpcbind
        headers = {"Authorization": f"Bearer {volume['token']}"}
        with fresh_server.client() as api:
            content = api.get(
                f"/volumecontent/{volume['volumeID']}/file", params={"path": "/f"}, headers=headers
            )
        assert content.text == "before\nafter\n"
    finally:
        with fresh_server.client() as api:
            api.delete(f"/sandboxes/{sandbox['sandboxID']}")
