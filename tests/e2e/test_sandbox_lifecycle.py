"""Real microVM sandboxes through the real server: create, exec, files, expiry, restart, leaks."""

from __future__ import annotations

import base64
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from agentenv.cli.client import EnvdClient

from ..live import TEST_KEY, HostResources, LiveServer, vmm_pid, wait_for
from ..vmfactory import VmFactory

pytestmark = pytest.mark.vm


def run(
    server: LiveServer,
    sandbox: dict[str, Any],
    cmd: str,
    *,
    user: str | None = None,
    envs: dict[str, str] | None = None,
    cwd: str | None = None,
) -> tuple[str, str, int]:
    """Run `cmd` through the proxy with `process.Process/Start`, as the E2B SDK does."""
    envd = EnvdClient(server.url, sandbox["sandboxID"], sandbox.get("envdAccessToken"), user=user)
    process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}
    if envs:
        process["envs"] = envs
    if cwd:
        process["cwd"] = cwd
    out, err, code = b"", b"", None
    with envd:
        for message in envd.stream("process.Process/Start", {"process": process, "stdin": False}):
            event = message.get("event", {})
            data = event.get("data", {})
            out += base64.b64decode(data.get("stdout", ""))
            err += base64.b64decode(data.get("stderr", ""))
            if "end" in event:
                code = event["end"].get("exitCode", 0)
    assert code is not None, "no end event"
    return out.decode(), err.decode(), code


def kill(server: LiveServer, sandbox_id: str) -> None:
    with server.client() as api:
        assert api.delete(f"/sandboxes/{sandbox_id}").status_code == 204


def test_create_exec_files_delete(server: LiveServer, vms: VmFactory) -> None:
    before = server.resources()
    sandbox = vms.create(server, envVars={"GREETING": "hello"}, metadata={"suite": "core"})
    sid = sandbox["sandboxID"]
    assert sandbox["templateID"] == "base"
    assert sandbox["envdVersion"]

    out, err, code = run(server, sandbox, "echo out; echo err >&2; exit 3")
    assert (out, err, code) == ("out\n", "err\n", 3)
    out, _, code = run(server, sandbox, "uname -s; whoami; pwd")
    assert (out, code) == ("Linux\nuser\n/home/user\n", 0)
    out, _, _ = run(server, sandbox, "echo $GREETING $EXTRA", envs={"EXTRA": "world"})
    assert out == "hello world\n"
    out, _, _ = run(server, sandbox, "whoami; pwd", user="root", cwd="/tmp")
    assert out == "root\n/tmp\n"

    envd = EnvdClient(server.url, sid, sandbox.get("envdAccessToken"))
    with envd:
        written = envd._http.post(
            "/files", params={"path": "notes/a.txt"}, files={"file": ("a.txt", b"data\x00\xff")}
        )
        assert written.status_code == 200, written.text
        assert written.json()[0]["path"] == "/home/user/notes/a.txt"
        read = envd._http.get("/files", params={"path": "/home/user/notes/a.txt"})
        assert read.status_code == 200
        assert read.content == b"data\x00\xff"
    out, _, _ = run(server, sandbox, "stat -c %U notes/a.txt; sha256sum < notes/a.txt")
    assert out.startswith("user\n")

    with server.client() as api:
        listed = api.get("/v2/sandboxes", params={"metadata": "suite=core"}).json()
        assert [s["sandboxID"] for s in listed] == [sid]
        assert listed[0]["state"] == "running"
        info = api.get(f"/sandboxes/{sid}").json()
        assert info["metadata"] == {"suite": "core"}
    kill(server, sid)
    with server.client() as api:
        assert api.get(f"/sandboxes/{sid}").status_code == 404
        gone = api.delete(f"/sandboxes/{sid}")
        assert gone.status_code == 404
        assert gone.json()["code"] == 404
        proxied = EnvdClient(server.url, sid)._http.get("/health")
        assert proxied.status_code == 502
        assert "was not found" in proxied.json()["message"]
    assert server.resources() == before


def test_base_carries_what_agents_use(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server)
    script = (
        "git --version && python --version && pip --version && wget --version | head -1 "
        "&& python -m venv /tmp/venv && sudo -n true && echo ok"
    )
    out, err, code = run(server, sandbox, script)
    assert code == 0 and out.splitlines()[-1] == "ok", (out, err)


def test_timeout_expiry_kills(server: LiveServer, vms: VmFactory) -> None:
    before = server.resources()
    sandbox = vms.create(server, timeout=2)
    sid = sandbox["sandboxID"]
    with server.client() as api:
        assert wait_for(lambda: api.get(f"/sandboxes/{sid}").status_code == 404, timeout=30)
    assert wait_for(lambda: server.resources() == before, timeout=10)


def test_set_timeout_and_refresh(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server, timeout=600)
    sid = sandbox["sandboxID"]
    with server.client() as api:
        end_before = api.get(f"/sandboxes/{sid}").json()["endAt"]
        assert api.post(f"/sandboxes/{sid}/timeout", json={"timeout": 30}).status_code == 204
        end_short = api.get(f"/sandboxes/{sid}").json()["endAt"]
        assert end_short < end_before
        assert api.post(f"/sandboxes/{sid}/refreshes", json={"duration": 60}).status_code == 204
        assert api.get(f"/sandboxes/{sid}").json()["endAt"] > end_short
        assert api.post("/sandboxes/nope/timeout", json={"timeout": 30}).status_code == 404
    kill(server, sid)


def test_metrics_of_many_sandboxes(server: LiveServer, vms: VmFactory) -> None:
    """E2B's `GET /sandboxes/metrics`: a sample now of each listed running sandbox."""
    sid = vms.create(server)["sandboxID"]
    with server.client() as api:
        answer = api.get("/sandboxes/metrics", params={"sandbox_ids": f"{sid},inotasandbox"})
        assert answer.status_code == 200, answer.text
        metrics = answer.json()["sandboxes"]
        assert list(metrics) == [sid]
        assert metrics[sid]["memTotal"] > 0 and metrics[sid]["cpuCount"] >= 1
        for bad in ("", ",".join(f"i{n}" for n in range(101))):
            assert api.get("/sandboxes/metrics", params={"sandbox_ids": bad}).status_code == 400
    kill(server, sid)


def test_a_guest_of_exactly_two_gib_boots(fresh_server: LiveServer, vms: VmFactory) -> None:
    """Under SeaBIOS a 2 GiB guest found its initrd overwritten and never booted (1,984,
    2,047 and 2,049 MiB did): the firmware's disk set-up used the top of RAM, where QEMU
    put the initrd."""
    fresh_server.extra_env["AENV_SANDBOX_MEMORY_MB"] = "2048"
    fresh_server.start()
    sandbox = vms.create(fresh_server)
    total_kib = int(run(fresh_server, sandbox, "grep MemTotal /proc/meminfo")[0].split()[1])
    assert 1800 < total_kib / 1024 <= 2048
    kill(fresh_server, sandbox["sandboxID"])


def test_an_idle_guest_stops_its_tick(server: LiveServer, vms: VmFactory) -> None:
    """Without a timer that runs in idle (microvm has no HPET; TCG's CPU had no ARAT) the
    kernel ticked 250 times a second asleep, which under TCG is most of an idle VM's CPU."""
    sandbox = vms.create(server)
    script = "grep LOC: /proc/interrupts; sleep 4; grep LOC: /proc/interrupts; cat /proc/timer_list"
    out = run(server, sandbox, script, user="root")[0]
    before, after = (int(line.split()[1]) for line in out.splitlines() if line.startswith("LOC:"))
    assert after - before < 4 * 100, out[:2000]  # a periodic tick: 1,000 in 4 s
    assert "hrtimer_interrupt" in out
    kill(server, sandbox["sandboxID"])


def test_a_guest_runs_niced_below_the_node(server: LiveServer, vms: VmFactory) -> None:
    """Every thread of a guest's QEMU (its vCPU too) runs at `vmm.guest_nice`, 5 by
    default: a guest that spins every core leaves the node's API served first."""
    sandbox = vms.create(server)
    pid = vmm_pid(server, sandbox["sandboxID"])
    assert pid is not None
    threads = list(Path(f"/proc/{pid}/task").iterdir())
    # `stat`'s 19th field, counted after the parenthesised command name.
    nices = {int(t.joinpath("stat").read_text().rsplit(")", 1)[1].split()[16]) for t in threads}
    assert len(threads) > 1 and nices == {5}, nices
    assert server.proc is not None
    node = Path(f"/proc/{server.proc.pid}/stat").read_text()
    assert int(node.rsplit(")", 1)[1].split()[16]) == 0
    kill(server, sandbox["sandboxID"])


def test_restart_readopts_live_sandbox(fresh_server: LiveServer, vms: VmFactory) -> None:
    fresh_server.start()
    sandbox = vms.create(fresh_server)
    sid = sandbox["sandboxID"]
    run(fresh_server, sandbox, "echo kept > /home/user/mark")
    fresh_server.stop()
    fresh_server.start()
    with fresh_server.client() as api:
        assert api.get(f"/sandboxes/{sid}").json()["state"] == "running"
    assert run(fresh_server, sandbox, "cat /home/user/mark")[0] == "kept\n"
    kill(fresh_server, sid)
    assert fresh_server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)


def test_restart_cleans_up_dead_sandboxes(fresh_server: LiveServer, vms: VmFactory) -> None:
    fresh_server.start()
    sandbox = vms.create(fresh_server)
    fresh_server.stop()
    info = fresh_server.home / "sandboxes" / sandbox["sandboxID"]
    subprocess.run(["pkill", "-KILL", "-f", str(info)], check=False)
    fresh_server.start()
    with fresh_server.client() as api:
        assert api.get(f"/sandboxes/{sandbox['sandboxID']}").status_code == 404
    assert fresh_server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)


def test_twenty_cycles_return_to_baseline(server: LiveServer, vms: VmFactory) -> None:
    before = server.resources()
    for _ in range(20):
        sandbox = vms.create(server)
        kill(server, sandbox["sandboxID"])
    assert server.resources() == before


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({"templateID": "no-such-template"}, 404, "not found"),
        ({"templateID": "base", "timeout": -1}, 400, "timeout"),
        ({"templateID": "base", "colour": "red"}, 400, "colour"),
        ({"templateID": 7}, 400, "templateID"),
        ({}, 400, "templateID"),
    ],
)
def test_bad_create_requests(server: LiveServer, body: dict, status: int, text: str) -> None:
    before = server.resources()
    with server.client() as api:
        response = api.post("/v2/sandboxes", json=body)
    assert response.status_code == status
    error = response.json()
    assert error["code"] == status
    assert text in error["message"]
    assert server.resources() == before


def test_malformed_json_and_auth(server: LiveServer) -> None:
    with server.client() as api:
        bad = api.post(
            "/v2/sandboxes", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert bad.status_code == 400
        assert bad.json()["code"] == 400
    with server.client(key=None) as anon:
        missing = anon.get("/v2/sandboxes")
        assert (missing.status_code, missing.json()["code"]) == (401, 401)
        assert anon.get("/health").status_code == 200
    with server.client(key=TEST_KEY + "0") as wrong:
        assert wrong.get("/v2/sandboxes").status_code == 401
    with server.client() as api:
        assert api.get("/openapi.json").json()["info"]["title"] == "AgentENV"


def test_not_enough_memory_is_429_after_a_wait_and_leaves_nothing(
    fresh_server: LiveServer,
) -> None:
    fresh_server.extra_env["AENV_SANDBOX_MIN_FREE_MEMORY_MB"] = str(10**9)
    fresh_server.extra_env["AENV_SANDBOX_ADMISSION_WAIT"] = "1"
    fresh_server.start()
    with fresh_server.client() as api:
        response = api.post("/v2/sandboxes", json={"templateID": "base"})
        assert response.status_code == 429 and response.headers["retry-after"] == "1"
        assert "waited 1 s for room" in response.json()["message"]
        assert "not enough host memory" in response.json()["message"]
        assert api.get("/v2/sandboxes").json() == []
    assert fresh_server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)


def test_pause_and_connect_resume_where_it_stopped(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server)
    sid = sandbox["sandboxID"]
    run(
        server,
        sandbox,
        "echo $$ > /tmp/shell.pid; nohup sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/sleep.pid",
    )
    with server.client() as api:
        assert api.post(f"/sandboxes/{sid}/pause", json={}).status_code == 204
        # Paused, the sandbox holds files, not a VMM process (nor its memory).
        assert vmm_pid(server, sid) is None
        assert (server.home / "sandboxes" / sid / "snapshot" / "vmstate").is_file()
        again = api.post(f"/sandboxes/{sid}/pause", json={})
        assert (again.status_code, again.json()["code"]) == (409, 409)
        assert api.get(f"/sandboxes/{sid}").json()["state"] == "paused"
        listed = api.get("/v2/sandboxes", params={"state": "paused"}).json()
        assert sid in [s["sandboxID"] for s in listed]
        assert sid not in [s["sandboxID"] for s in api.get("/sandboxes").json()]
        # Already paused: a filesystem-only pause is refused like any other (409).
        assert api.post(f"/sandboxes/{sid}/pause", json={"memory": False}).status_code == 409
        resumed = api.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 120})
        assert resumed.status_code == 201, resumed.text
        assert resumed.json()["sandboxID"] == sid
        running = api.post(f"/v2/sandboxes/{sid}/connect", json={})
        assert running.status_code == 200
        assert api.post(f"/sandboxes/{sid}/resume", json={}).status_code == 409
    out, _, code = run(server, sandbox, "kill -0 $(cat /tmp/sleep.pid) && echo alive")
    assert (out, code) == ("alive\n", 0)
    kill(server, sid)


def test_paused_sandbox_survives_a_server_restart(fresh_server: LiveServer, vms: VmFactory) -> None:
    fresh_server.start()
    sandbox = vms.create(fresh_server)
    sid = sandbox["sandboxID"]
    run(fresh_server, sandbox, "echo kept > /tmp/mark; nohup sleep 1000 >/dev/null 2>&1 &")
    with fresh_server.client() as api:
        assert api.post(f"/sandboxes/{sid}/pause", json={}).status_code == 204
    fresh_server.stop()
    fresh_server.start()
    with fresh_server.client() as api:
        assert api.get(f"/sandboxes/{sid}").json()["state"] == "paused"
        assert api.post(f"/sandboxes/{sid}/connect", json={"timeout": 60}).status_code == 201
    out, _, _ = run(fresh_server, sandbox, "cat /tmp/mark; pgrep -x sleep >/dev/null && echo up")
    assert out == "kept\nup\n"
    clock, _, _ = run(fresh_server, sandbox, "date +%s")
    assert abs(int(clock) - time.time()) < 10
    kill(fresh_server, sid)
    assert fresh_server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)


def test_auto_pause_on_expiry(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server, timeout=2, autoPause=True)
    sid = sandbox["sandboxID"]
    with server.client() as api:
        assert wait_for(lambda: api.get(f"/sandboxes/{sid}").json()["state"] == "paused", 30)
        assert api.get(f"/sandboxes/{sid}").json()["lifecycle"]["onTimeout"] == "pause"
        assert api.post(f"/sandboxes/{sid}/connect", json={"timeout": 60}).status_code == 201
    assert run(server, sandbox, "echo back")[0] == "back\n"
    kill(server, sid)


def test_api_key_generated_once_with_private_mode(fresh_server: LiveServer) -> None:
    fresh_server.extra_env["AENV_API_KEY"] = ""
    fresh_server.start()
    key_file = fresh_server.home / "secrets" / "api-key"
    key = key_file.read_text().strip()
    assert key.startswith("e2b_") and int(key[4:], 16) >= 0
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert fresh_server.log_tail(limit=10**7).count(key) == 1
    with fresh_server.client(key=key) as api:
        assert api.get("/v2/sandboxes").status_code == 200
    fresh_server.stop()
    fresh_server.start()
    assert fresh_server.log_tail(limit=10**7).count(key) == 1
    assert key_file.read_text().strip() == key
