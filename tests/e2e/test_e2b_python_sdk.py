"""The unmodified `e2b` Python SDK against a live server, configured only by environment."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    GuestUnresponsiveException,
    Sandbox,
    SandboxQuery,
    SandboxState,
    Template,
)
from e2b.exceptions import NotFoundException, SandboxException, TimeoutException

from ..live import LiveServer, wait_for

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]


@pytest.fixture
def sbx() -> Iterator[Sandbox]:
    sandbox = Sandbox.create(envs={"FROM_CREATE": "yes"}, metadata={"sdk": "python"})
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_commands(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo hi; echo oops >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("hi\n", "oops\n", 0)
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo partial; exit 4")
    assert failed.value.exit_code == 4
    assert failed.value.stdout == "partial\n"
    assert sbx.commands.run("echo $FROM_CREATE $X", envs={"X": "1"}).stdout == "yes 1\n"
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sbx.commands.run("whoami", user="root").stdout == "root\n"
    assert sbx.commands.run("whoami").stdout == "user\n"
    big = sbx.commands.run("head -c 1048576 /dev/zero | tr '\\0' a")
    assert len(big.stdout) == 1048576
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=2)
    chunks: list[str] = []
    sbx.commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", on_stdout=chunks.append)
    assert "".join(chunks) == "1\n2\n3\n"


def test_background_commands(sbx: Sandbox) -> None:
    handle = sbx.commands.run("sleep 600", background=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(handle.pid)
    assert not sbx.commands.kill(999999)
    reader = sbx.commands.run("read line; echo got $line", background=True, stdin=True)
    sbx.commands.send_stdin(reader.pid, "ping\n")
    assert reader.wait().stdout == "got ping\n"
    ticker = sbx.commands.run("sleep 1; echo tick", background=True)
    again = sbx.commands.connect(ticker.pid)
    assert again.wait().stdout == "tick\n"


def test_pty(sbx: Sandbox) -> None:
    from e2b import PtySize

    output = bytearray()
    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.resize(terminal.pid, PtySize(rows=40, cols=132))
    sbx.pty.send_stdin(terminal.pid, b"stty size; exit\n")
    terminal.wait(on_pty=output.extend)
    assert b"40 132" in bytes(output)


def test_files(sbx: Sandbox) -> None:
    info = sbx.files.write("notes/hello.txt", "hello")
    assert info.path == "/home/user/notes/hello.txt"
    assert sbx.files.read("notes/hello.txt") == "hello"
    sbx.files.write("/tmp/blob.bin", b"\x00\x01\xff")
    assert bytes(sbx.files.read("/tmp/blob.bin", format="bytes")) == b"\x00\x01\xff"
    sbx.files.write_files([
        {"path": "/tmp/many/a.txt", "data": "a"},
        {"path": "/tmp/many/b.txt", "data": "b"},
    ])  # fmt: skip
    assert sorted(e.name for e in sbx.files.list("/tmp/many")) == ["a.txt", "b.txt"]
    assert sbx.files.make_dir("/tmp/made/deep")
    assert not sbx.files.make_dir("/tmp/made/deep")
    assert sbx.files.exists("/tmp/many/a.txt")
    assert not sbx.files.exists("/tmp/nope")
    assert sbx.files.get_info("/tmp/many/a.txt").size == 1
    sbx.files.rename("/tmp/many/a.txt", "/tmp/many/c.txt")
    assert sbx.files.exists("/tmp/many/c.txt")
    sbx.files.remove("/tmp/many")
    assert not sbx.files.exists("/tmp/many")
    # Metadata (envd 0.6.2) lives in the guest's xattrs: seen there, and kept by a pause.
    assert sbx.files.write("/tmp/m.txt", "m", metadata={"Author": "me"}).metadata == {
        "author": "me"
    }
    xattr = "import os; print(os.getxattr('/tmp/m.txt', 'user.e2b.author').decode())"
    assert sbx.commands.run(f'python3 -c "{xattr}"').stdout == "me\n"
    sbx.pause()
    sbx.connect()
    assert sbx.files.get_info("/tmp/m.txt").metadata == {"author": "me"}
    # /proc reports a size of 0; the file is still read to its end.
    assert len(sbx.files.read("/proc/sys/kernel/random/boot_id").strip()) == 36


def test_watch_dir(sbx: Sandbox) -> None:
    sbx.files.make_dir("/tmp/watched")
    watcher = sbx.files.watch_dir("/tmp/watched", include_entry=True, allow_network_mounts=True)
    sbx.files.write("/tmp/watched/new.txt", "x")
    deadline = time.monotonic() + 10
    entries = {}
    while time.monotonic() < deadline and "new.txt" not in entries:
        entries |= {event.name: event.entry for event in watcher.get_new_events()}
        time.sleep(0.2)
    watcher.stop()
    assert entries["new.txt"] is not None
    assert entries["new.txt"].path == "/tmp/watched/new.txt"


def test_list_info_timeout_pause_connect(sbx: Sandbox) -> None:
    from e2b import SandboxQuery

    listed = Sandbox.list(query=SandboxQuery(metadata={"sdk": "python"})).next_items()
    assert sbx.sandbox_id in [s.sandbox_id for s in listed]
    info = sbx.get_info()
    assert info.metadata == {"sdk": "python"}
    sbx.set_timeout(120)
    assert sbx.is_running()
    sbx.pause()
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.commands.run("echo resumed").stdout == "resumed\n"


def test_not_found_errors() -> None:
    with pytest.raises(NotFoundException):
        Sandbox.connect("inotasandbox00000000")
    assert not Sandbox.kill("inotasandbox00000000")
    with pytest.raises(SandboxException):
        Sandbox.create(template="no-such-template")


def test_async_client() -> None:
    async def scenario() -> str:
        sandbox = await AsyncSandbox.create()
        try:
            result = await sandbox.commands.run("echo async")
            await sandbox.files.write("/tmp/a.txt", "A")
            assert await sandbox.files.read("/tmp/a.txt") == "A"
            return result.stdout
        finally:
            await sandbox.kill()

    assert asyncio.run(scenario()) == "async\n"


def test_traffic_wakes_a_sandbox_that_asked_for_it(server: LiveServer) -> None:
    sandbox = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        assert sandbox.get_info().lifecycle == {"auto_resume": True, "on_timeout": "pause"}
        sandbox.commands.run("python3 -m http.server 8000", background=True)
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8000"}
        # Listening before it pauses (Python starts slowly in a guest on a loaded host).
        assert wait_for(lambda: httpx.get(f"{server.url}/", headers=headers).is_success, 60)
        sandbox.set_timeout(1)
        assert wait_for(lambda: sandbox.get_info().state == SandboxState.PAUSED, 60)
        # A request for one of its ports resumes it and gets its answer.
        answer = httpx.get(f"{server.url}/", headers=headers, timeout=60)
        assert answer.status_code == 200 and "Directory listing" in answer.text
        assert sandbox.get_info().state == SandboxState.RUNNING
    finally:
        sandbox.kill()
    # Without it, traffic finds the sandbox paused, as before.
    sleeper = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": False})
    try:
        assert wait_for(lambda: sleeper.get_info().state == SandboxState.PAUSED, 60)
        headers = {"E2b-Sandbox-Id": sleeper.sandbox_id, "E2b-Sandbox-Port": "49983"}
        assert httpx.get(f"{server.url}/health", headers=headers).status_code == 502
    finally:
        sleeper.kill()


def test_a_pause_while_the_agent_is_silent_resumes_only_by_reboot() -> None:
    """E2B's `envdUnresponsiveAtPause`: the memory of a guest whose agent did not answer
    is not restored (`GuestUnresponsiveException`); `on_resume="reboot"` starts it afresh."""
    sandbox = Sandbox.create()
    try:
        sandbox.files.write("/home/user/kept", "on disk")
        sandbox.commands.run("sync")  # a reboot keeps the disk, not the page cache
        # The agent stops answering a second after this command has been answered.
        stop = "(sleep 1; pkill -STOP -f '[a]env_agent --port') >/dev/null 2>&1 &"
        sandbox.commands.run(stop, user="root")
        time.sleep(3)
        sandbox.pause()
        assert Sandbox.get_info(sandbox.sandbox_id).envd_unresponsive_at_pause is True
        with pytest.raises(GuestUnresponsiveException):
            Sandbox.connect(sandbox.sandbox_id)
        rebooted = Sandbox.connect(sandbox.sandbox_id, on_resume="reboot")
        assert rebooted.files.read("/home/user/kept") == "on disk"
        assert rebooted.get_info().envd_unresponsive_at_pause is None
    finally:
        sandbox.kill()


def test_a_command_of_a_killed_sandbox_says_so() -> None:
    sandbox = Sandbox.create()
    command = sandbox.commands.run("sleep 60", background=True)
    sandbox.kill()
    started = time.monotonic()
    with pytest.raises(SandboxException) as caught:
        command.wait()
    # The stream breaks at once; the SDK's health probe then finds the sandbox gone.
    assert time.monotonic() - started < 30
    assert "killed or reached its end of life" in str(caught.value)


def test_metrics_over_a_time_range(sbx: Sandbox) -> None:
    first = sbx.get_metrics()
    time.sleep(1.1)
    second = sbx.get_metrics()
    # The node keeps what it sampled: a second call has both samples.
    assert len(first) >= 1 and len(second) >= len(first) + 1
    assert second[0].mem_total > 0 and second[-1].cpu_count >= 1
    now = datetime.now(UTC)
    assert sbx.get_metrics(start=now - timedelta(hours=1), end=now - timedelta(minutes=30)) == []
    recent = sbx.get_metrics(start=now - timedelta(seconds=30), end=now + timedelta(seconds=5))
    assert recent and all(now.timestamp() - 31 <= m.timestamp.timestamp() for m in recent)


def test_listing_pages_newest_first() -> None:
    tag = {"page_test": str(time.time_ns())}
    older = Sandbox.create(metadata=tag)
    newer = Sandbox.create(metadata=tag)
    try:
        paginator = Sandbox.list(query=SandboxQuery(metadata=tag), limit=1)
        first = paginator.next_items()
        assert [s.sandbox_id for s in first] == [newer.sandbox_id] and paginator.has_next
        second = paginator.next_items()
        assert [s.sandbox_id for s in second] == [older.sandbox_id]
        assert not paginator.has_next and paginator.next_token is None
        ascending = Sandbox.list(query=SandboxQuery(metadata=tag), order="asc").next_items()
        assert [s.sandbox_id for s in ascending] == [older.sandbox_id, newer.sandbox_id]

        def listed(**query) -> list[str]:
            found = Sandbox.list(query=SandboxQuery(metadata=tag, **query)).next_items()
            return [s.sandbox_id for s in found]

        started = newer.get_info().started_at
        assert listed(started_after=started) == [newer.sandbox_id]
        assert listed(started_after=started + timedelta(seconds=1)) == []
        assert listed(template=newer.get_info().template_id) == [newer.sandbox_id, older.sandbox_id]
        assert listed(template="unknown-template") == []
    finally:
        older.kill()
        newer.kill()


def test_signed_file_urls_work_without_routing_headers() -> None:
    """A secure sandbox's signed URLs are plain URLs on `E2B_SANDBOX_URL`: anyone holding one
    reads or writes that file with no header, until it expires; another sandbox's token or
    a stale expiry is refused."""
    sandbox = Sandbox.create(secure=True)
    other = Sandbox.create(secure=True)
    try:
        upload = sandbox.upload_url("/home/user/up.txt", "user", 60)
        assert httpx.post(upload, files={"file": ("up.txt", b"uploaded")}).is_success
        assert sandbox.files.read("/home/user/up.txt") == "uploaded"
        download = httpx.get(sandbox.download_url("/home/user/up.txt", "user", 60))
        assert (download.status_code, download.text) == (200, "uploaded")
        expired = httpx.get(sandbox.download_url("/home/user/up.txt", "user", -60))
        assert expired.status_code == 401
        assert expired.json() == {"code": 401, "message": "signature is already expired"}
        # Signed by no running sandbox: it is left to the API, which has no such route.
        forged = httpx.get(f"{sandbox.download_url('/home/user/up.txt', 'user')}x")
        assert forged.status_code == 404
        assert httpx.get(other.download_url("/home/user/up.txt", "user")).status_code == 404
    finally:
        sandbox.kill()
        other.kill()


def test_an_mcp_gateway_that_cannot_start_leaves_no_sandbox() -> None:
    """`mcp` is accepted; the SDK starts `mcp-gateway` itself, which `base` lacks, so the
    create fails clearly and the SDK kills the sandbox."""
    tag = {"mcp_test": str(time.time_ns())}
    with pytest.raises(SandboxException, match="Failed to start MCP gateway"):
        Sandbox.create("base", metadata=tag, mcp={"invalid_server": {}})  # type: ignore[arg-type]
    assert Sandbox.list(query=SandboxQuery(metadata=tag)).next_items() == []


def test_sandbox_logs(server: LiveServer, sbx: Sandbox) -> None:
    """Both of E2B's log routes: the guest's processes, filtered and ordered as asked."""
    sbx.commands.run("echo first")
    sbx.commands.run("echo second")
    with server.client() as api:
        v1 = api.get(f"/sandboxes/{sbx.sandbox_id}/logs").json()
        v2 = api.get(f"/v2/sandboxes/{sbx.sandbox_id}/logs", params={"search": "started"}).json()
        back = api.get(
            f"/v2/sandboxes/{sbx.sandbox_id}/logs", params={"direction": "backward", "limit": 1}
        ).json()
        errors = api.get(f"/v2/sandboxes/{sbx.sandbox_id}/logs", params={"level": "error"})
        bad = api.get(f"/v2/sandboxes/{sbx.sandbox_id}/logs", params={"level": "loud"})
    lines = [json.loads(entry["line"]) for entry in v1["logs"]]
    commands = [line["cmd"] for line in lines if line["message"] == "process started"]
    assert any("echo first" in c for c in commands) and any("echo second" in c for c in commands)
    assert {line["level"] for line in lines} == {"info"} and len(v1["logEntries"]) == len(lines)
    started = [entry["fields"]["cmd"] for entry in v2["logs"]]
    assert started == [c for c in commands]
    assert [entry["message"] for entry in back["logs"]] == ["process ended"]
    assert errors.json() == {"logs": []}
    assert bad.status_code == 400


def test_what_sdk_2_64_added_cpus_shells_and_paged_templates() -> None:
    """`Sandbox.create(cpu_count=…)`, `commands.run(shell=…)` and `Template.list(limit=…)`;
    a snapshot of a running guest keeps its CPUs, and asking for others is a clear 400."""
    sandbox = Sandbox.create(cpu_count=2)
    api = os.environ["E2B_API_URL"]
    key = {"X-API-Key": os.environ["E2B_API_KEY"]}
    record = f"{api}/unstable/sandboxes/{sandbox.sandbox_id}/record"
    try:
        assert sandbox.commands.run("nproc").stdout == "2\n"
        answer = httpx.get(record, headers=key)
        assert answer.status_code == 200 and answer.json()["cpuCount"] == 2, answer.text
        assert sandbox.commands.run("echo $0", shell=["/bin/sh", "-c"]).stdout == "/bin/sh\n"
        sandbox.pause()
        refused = httpx.post(
            f"{api}/sandboxes/{sandbox.sandbox_id}/resume", json={"cpuCount": 1}, headers=key
        )
        assert refused.status_code == 400 and "its 2 CPUs" in refused.json()["message"]
        sandbox = Sandbox.connect(sandbox.sandbox_id)
        snapshot = sandbox.create_snapshot()
    finally:
        sandbox.kill()
    assert httpx.get(record, headers=key).status_code == 404
    try:
        with pytest.raises(SandboxException, match="its size is fixed") as fixed:
            Sandbox.create(snapshot.snapshot_id, cpu_count=1)
        assert fixed.value.status_code == 400
        again = Sandbox.create(snapshot.snapshot_id, cpu_count=2)
        assert again.commands.run("nproc").stdout == "2\n"
        again.kill()
    finally:
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    with pytest.raises(SandboxException, match="cpuCount: at most") as too_many:
        Sandbox.create(cpu_count=16)
    assert too_many.value.status_code == 400
    paginator = Template.list(limit=1)
    listed = []
    while paginator.has_next:
        page = paginator.next_items()
        assert len(page) <= 1
        listed += [t.template_id for t in page]
    assert "base" in listed and listed == sorted(listed)
