"""The per-test VM factory: sandboxes for one test, killed after it, and the host checked
back to where it was (after Firecracker's `microvm_factory`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .live import HostResources, LiveServer, leftovers, sweep, wait_for

# Kills finish their clean-up in the background (a VMM's exit, a namespace's removal).
SETTLE_S = 60.0


@dataclass
class _Watch:
    """A server the test uses, as it was before the test."""

    server: LiveServer
    baseline: HostResources
    sandboxes: set[str]


@dataclass
class VmFactory:
    """Sandboxes for one test. At its end, the sandboxes made during the test (through
    `create` or any client) are killed, and each server's host resources must be back
    to their baseline; servers it owns are closed and must have left nothing at all."""

    watches: dict[int, _Watch] = field(default_factory=dict)
    owned: list[LiveServer] = field(default_factory=list)

    def watch(self, server: LiveServer) -> LiveServer:
        """Measure `server`'s baseline now (once per test): its resources and sandboxes."""
        if id(server) not in self.watches:
            running = server.proc is not None and server.proc.poll() is None
            self.watches[id(server)] = _Watch(
                server, server.resources(), server.sandbox_ids() if running else set()
            )
        return server

    def own(self, server: LiveServer) -> LiveServer:
        """A server for this test alone: closed at its end, and nothing of it may remain."""
        self.owned.append(server)
        return server

    def create(self, server: LiveServer, **body: Any) -> dict[str, Any]:
        """A sandbox of the `base` template (or as `body` says) on `server`."""
        if not any(server is owned for owned in self.owned):
            self.watch(server)
        with server.client() as api:
            response = api.post("/v2/sandboxes", json={"templateID": "base", **body})
        assert response.status_code == 201, response.text
        return response.json()

    def close(self) -> None:
        """Kill what the test made, close owned servers, and check the host."""
        failures = []
        for server in self.owned:
            try:
                server.close()
            except Exception as exc:  # the others are closed and checked all the same
                failures.append(f"server {server.prefix} did not close: {exc!r}")
            if left := leftovers(server):
                failures.append(f"server {server.prefix} left {left}")
                sweep(server)
        for watch in self.watches.values():
            if (failure := _restore(watch)) is not None:
                failures.append(failure)
        assert not failures, "\n".join(failures)


def _restore(watch: _Watch) -> str | None:
    """Kill the sandboxes made since the baseline; why the host is not back to it, if not."""
    server = watch.server
    if server.proc is None or server.proc.poll() is not None:
        return f"server {server.prefix} is not running: {server.log_tail(2000)}"
    with server.client(key=server.api_key) as api:
        for sandbox_id in server.sandbox_ids() - watch.sandboxes:
            api.delete(f"/sandboxes/{sandbox_id}")
    expected = watch.baseline.transient()
    if wait_for(lambda: server.resources().transient().within(expected), SETTLE_S):
        return None
    return f"server {server.prefix}: expected {expected}, found {server.resources().transient()}"
