"""Memory density on real VMs: what a guest frees returns to the host, a balloon takes
memory from a guest and gives it back, an idle guest drops its caches, the node reports
each sandbox's host memory (metrics, listings, Prometheus), and a sandbox's idle-pause
policy pauses it."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentenv.runtime.memory.admission import available_memory_mb, total_memory_mb

from ..live import HostResources, LiveServer, vmm_pid, wait_for
from ..vmfactory import VmFactory
from .test_sandbox_lifecycle import kill, run

pytestmark = pytest.mark.vm

MIB = 1024 * 1024
# Holds 120 MiB of fresh data until killed; /tmp/held says it has all of it.
HOLD = (
    "nohup python3 -c 'import os, time; b = os.urandom(120 << 20); "
    'open("/tmp/held", "w").close(); time.sleep(3600)\' >/dev/null 2>&1 &'
)


def metrics(server: LiveServer, sandbox_id: str) -> dict[str, Any]:
    with server.client() as api:
        answer = api.get(f"/sandboxes/{sandbox_id}/metrics")
    assert answer.status_code == 200, answer.text
    return answer.json()[-1]  # oldest first: the last is the one taken now


def host_mb(server: LiveServer, sandbox_id: str) -> int:
    return metrics(server, sandbox_id)["hostMemUsed"] // MIB


def guest_available_mb(server: LiveServer, sandbox: dict[str, Any]) -> int:
    """What the guest's kernel could still hand out (with deflate-on-OOM the balloon's
    pages stay in MemTotal, and leave MemAvailable)."""
    return int(run(server, sandbox, "awk '/MemAvailable/ {print $2}' /proc/meminfo")[0]) // 1024


def start_and_wait(server: LiveServer, sandbox: dict[str, Any], program: str, done: str) -> None:
    """Start `program` in the background and wait for the file it makes when ready."""
    run(server, sandbox, program)
    assert wait_for(lambda: run(server, sandbox, f"test -f {done}")[2] == 0, 120)


def test_memory_a_guest_frees_returns_to_the_host(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server)
    sandbox_id = sandbox["sandboxID"]
    start_and_wait(server, sandbox, HOLD, "/tmp/held")
    holding = host_mb(server, sandbox_id)
    assert holding > 150, holding
    run(server, sandbox, "pkill -f os.urandom; true")
    # Free page reporting hands the freed blocks back within seconds.
    assert wait_for(lambda: host_mb(server, sandbox_id) < holding - 90, 30), (
        holding,
        host_mb(server, sandbox_id),
    )
    log = (server.home / "sandboxes" / sandbox_id / "vmm.log").read_text()
    assert "Discarding RAM" not in log or "readonly files" not in log


# Writes 96 MiB one page per mapping, then unmaps every other page: 48 MiB free in the
# guest, none of it in a block bigger than one page. /tmp/freed says it is done.
FRAGMENT = (
    "nohup python3 -c 'import mmap, time\n"
    "pages = [mmap.mmap(-1, 4096, mmap.MAP_PRIVATE) for _ in range(24576)]\n"
    'for p in pages: p.write(b"x" * 4096)\n'
    "for p in pages[::2]: p.close()\n"
    'open("/tmp/freed", "w").close(); time.sleep(3600)\' >/dev/null 2>&1 &'
)


def test_scattered_free_pages_return_to_the_host(server: LiveServer, vms: VmFactory) -> None:
    """The guest reports single free pages, not only free 2 MiB blocks."""
    sandbox = vms.create(server)
    sandbox_id = sandbox["sandboxID"]
    start_and_wait(server, sandbox, FRAGMENT, "/tmp/freed")
    order = "/sys/module/page_reporting/parameters/page_reporting_order"
    assert run(server, sandbox, f"cat {order}", user="root")[0].strip() == "0"
    # 48 MiB the process still holds; the other 48 MiB go back, page by page.
    holding = host_mb(server, sandbox_id)
    assert wait_for(lambda: host_mb(server, sandbox_id) < holding - 30, 90), (
        holding,
        host_mb(server, sandbox_id),
    )


def test_a_restored_vm_holds_no_copy_of_the_kernel(server: LiveServer, vms: VmFactory) -> None:
    sandbox = vms.create(server)  # restored from the boot snapshot
    pid = vmm_pid(server, sandbox["sandboxID"])
    assert pid is not None
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    # QEMU reads -kernel and -initrd whole into its memory: a restored guest gets
    # the kernel's setup header only, and no initrd.
    assert "-initrd" not in argv and "-incoming" in argv
    assert Path(argv[argv.index("-kernel") + 1]).stat().st_size < 64 * 1024
    assert run(server, sandbox, "uname -r")[2] == 0


def test_a_balloon_takes_memory_from_the_guest_and_gives_it_back(
    server: LiveServer, vms: VmFactory
) -> None:
    sandbox = vms.create(server)
    sandbox_id = sandbox["sandboxID"]
    before = guest_available_mb(server, sandbox)
    with server.client() as api:
        assert (
            api.put(f"/sandboxes/{sandbox_id}/balloon", json={"targetMB": 160}).status_code == 204
        )
        assert wait_for(
            lambda: api.get(f"/sandboxes/{sandbox_id}/balloon").json()["actualMB"] == 160, 30
        )
        assert wait_for(lambda: guest_available_mb(server, sandbox) <= before - 70, 30)
        # The guest's report arrives with the device's next poll.
        assert wait_for(
            lambda: api.get(f"/sandboxes/{sandbox_id}/balloon").json().get("totalMB") is not None,
            30,
        )
        # Out of bounds: a clear 400, nothing changed.
        refused = api.put(f"/sandboxes/{sandbox_id}/balloon", json={"targetMB": 100_000})
        assert refused.status_code == 400 and "balloon target" in refused.json()["message"]
        assert (
            api.put(f"/sandboxes/{sandbox_id}/balloon", json={"targetMB": 256}).status_code == 204
        )
        assert wait_for(lambda: guest_available_mb(server, sandbox) >= before - 20, 30)


def test_an_idle_guest_drops_its_caches_and_the_node_reports_memory(
    fresh_server: LiveServer,
    vms: VmFactory,
) -> None:
    fresh_server.extra_env["AENV_SANDBOX_RECLAIM_AFTER_IDLE"] = "4"
    fresh_server.extra_env["AENV_SANDBOX_MEMORY_SAMPLE_INTERVAL"] = "1"
    fresh_server.start()
    sandbox = vms.create(fresh_server)
    sandbox_id = sandbox["sandboxID"]
    # 60 MiB of page cache: written, flushed, read back.
    run(
        fresh_server,
        sandbox,
        "head -c 60M /dev/urandom > ~/blob && sync && cat ~/blob > /dev/null",
    )
    cached = metrics(fresh_server, sandbox_id)["memCache"] // MIB
    assert cached >= 60, cached
    # Nobody calls it now (metrics are a probe): the guest drops what it cached.
    assert wait_for(lambda: metrics(fresh_server, sandbox_id)["memCache"] // MIB < cached - 40, 60)
    with fresh_server.client() as api:
        listed = {s["sandboxID"]: s for s in api.get("/v2/sandboxes").json()}
        assert wait_for(lambda: api.get("/v2/sandboxes").json()[0].get("hostMemoryMB"), 10)
        listed = {s["sandboxID"]: s for s in api.get("/v2/sandboxes").json()}
        assert 0 < listed[sandbox_id]["hostMemoryMB"] < 256 + 128
    prometheus = httpx.get(fresh_server.url + "/metrics").text
    pattern = rf'aenv_sandbox_memory_bytes{{kind="host_pss",sandbox="{sandbox_id}"}} (\S+)'
    found = re.search(pattern, prometheus)
    assert found is not None and float(found.group(1)) > 0, prometheus[-2000:]
    assert 'aenv_node_memory_mb{kind="held"}' in prometheus
    # Its own idle-pause policy pauses a sandbox once idle that long; the other stays.
    sleepy = vms.create(fresh_server, pauseAfterIdle=5)["sandboxID"]
    with fresh_server.client() as api:

        def state(sid: str) -> str:
            return api.get(f"/sandboxes/{sid}").json()["state"]

        assert wait_for(lambda: state(sleepy) == "paused", 60)
        assert state(sandbox_id) == "running"
        kill(fresh_server, sleepy)


def test_a_create_storm_gets_what_fits_and_clear_refusals(
    fresh_server: LiveServer, vms: VmFactory
) -> None:
    """Eight creates at once where three 256 MiB sandboxes fit: three run, five wait their
    turn for room, then get 429 naming memory, and nothing is left half-made."""
    room = (total_memory_mb() - 512) / (3.5 * 256)  # three fit, four do not
    fresh_server.extra_env["AENV_SANDBOX_MEMORY_OVERCOMMIT"] = f"{1 / room:.9f}"
    fresh_server.start()
    # First one alone, so that the boot snapshot exists and the storm's creates are quick.
    kill(fresh_server, vms.create(fresh_server)["sandboxID"])
    with fresh_server.client() as api:

        def attempt(_: int) -> httpx.Response:
            return api.post("/v2/sandboxes", json={"templateID": "base"}, timeout=300)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(attempt, range(8)))
        created = [a.json() for a in answers if a.status_code == 201]
        refused = [a for a in answers if a.status_code != 201]
        assert len(created) == 3, [a.text for a in answers]
        assert all(a.status_code == 429 and a.headers["retry-after"] for a in refused)
        assert all("not enough host memory" in a.json()["message"] for a in refused)
        listed = {s["sandboxID"] for s in api.get("/v2/sandboxes").json()}
        assert listed == {sandbox["sandboxID"] for sandbox in created}
    for sandbox in created:
        assert run(fresh_server, sandbox, "echo up")[0] == "up\n"
        kill(fresh_server, sandbox["sandboxID"])
    assert fresh_server.resources() == HostResources(0, 0, 0, 0, 0, 0, 0)


def test_admission_lets_a_create_in_once_a_guest_gave_memory_back(
    fresh_server: LiveServer,
    vms: VmFactory,
) -> None:
    """The live check: a create needs its whole memory available above the reserve. With
    the reserve set 600 MiB under what a new 2 GiB sandbox leaves, a guest holding 1,200
    MiB keeps the next create out; once it frees them, free page reporting lets it in. The
    margins (600 MiB either way) cover the host's own drift, other test workers' VMs
    included; each side is asked until it holds, as another worker's VM may come or go."""
    fresh_server.extra_env["AENV_SANDBOX_MEMORY_MB"] = "2048"
    fresh_server.start()
    holder = vms.create(fresh_server)
    run(fresh_server, holder, "echo warm")
    # The reserve is read at start; the holder keeps running across the restart.
    fresh_server.stop()
    reserve = available_memory_mb() - 2048 - 600
    fresh_server.extra_env["AENV_SANDBOX_MIN_FREE_MEMORY_MB"] = str(reserve)
    fresh_server.start()
    run(fresh_server, holder, HOLD.replace("120 << 20", "1200 << 20"))
    assert wait_for(lambda: run(fresh_server, holder, "test -f /tmp/held")[2] == 0, 180)
    with fresh_server.client() as api:

        def answered(status: int) -> bool:
            answer = api.post("/v2/sandboxes", json={"templateID": "base"})
            if answer.status_code == 201:
                kill(fresh_server, answer.json()["sandboxID"])
            else:
                assert answer.status_code == 429, answer.text
                assert "MiB available" in answer.json()["message"]
            return answer.status_code == status

        assert wait_for(lambda: answered(429), 60)
        run(fresh_server, holder, "pkill -f os.urandom; true")
        assert wait_for(lambda: answered(201), 120)
    kill(fresh_server, holder["sandboxID"])
