"""Shared by the benchmarks: a live server for one run, and the create-to-output probe."""

from __future__ import annotations

import base64
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from agentenv.cli.client import EnvdClient
from tests.live import Configured, LiveServer, boot_snapshot, vmm_pid


@contextmanager
def live_server(extra_env: Mapping[str, str] | None = None) -> Iterator[LiveServer]:
    """A started server with its own home (and config overrides), closed on exit."""
    with tempfile.TemporaryDirectory(prefix="aenv-bench-") as tmp:
        server = LiveServer(Path(tmp), extra_env=dict(extra_env or {}))
        try:
            server.start()
            yield server
        except Exception:
            print(server.log_tail(), file=sys.stderr)
            raise
        finally:
            server.close()


def create_sandbox(server: LiveServer, **body: object) -> dict:
    """Create a sandbox of `base` (with `body`'s fields) through the API; its answer."""
    with server.client() as api:
        created = api.post("/v2/sandboxes", json={"templateID": "base", **body})
    if created.status_code != 201:
        raise RuntimeError(f"create failed: {created.status_code} {created.text[:500]}")
    return created.json()


def create_to_first_output(server: LiveServer, template: str = "base") -> tuple[float, str]:
    """Create from `template` and run `echo ready`: (seconds until its output, sandbox id)."""
    start = time.perf_counter()
    created = create_sandbox(server, templateID=template)
    sandbox_id = created["sandboxID"]
    echo_ready(server, sandbox_id, created.get("envdAccessToken"))
    return time.perf_counter() - start, sandbox_id


def echo_ready(server: LiveServer, sandbox_id: str, token: str | None) -> None:
    """Run `echo ready` in the sandbox through the proxy until its output arrives."""
    message = {"process": {"cmd": "/bin/echo", "args": ["ready"]}, "stdin": False}
    with EnvdClient(server.url, sandbox_id, token) as envd:
        for event in envd.stream("process.Process/Start", message):
            data = event.get("event", {}).get("data", {})
            if base64.b64decode(data.get("stdout", "")) == b"ready\n":
                return
    raise RuntimeError(f"sandbox {sandbox_id}: `echo ready` printed nothing")


def wait_snapshot(server: Configured, memory_mb: int = 256, timeout: float = 300) -> Path:
    """The server's boot snapshot directory, once it is complete."""
    deadline = time.monotonic() + timeout
    while (path := boot_snapshot(server, memory_mb)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError("no boot snapshot within the timeout")
        time.sleep(0.5)
    return path


def vmm_rss_mib(server: LiveServer, sandbox_id: str) -> float:
    """Resident memory of the sandbox's VMM process; 0 when it has none (paused)."""
    pid = vmm_pid(server, sandbox_id)
    if pid is None:
        return 0.0
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def kill_all(server: LiveServer, sandbox_ids: list[str]) -> None:
    with server.client() as api:
        for sandbox_id in sandbox_ids:
            api.delete(f"/sandboxes/{sandbox_id}")
