"""A local cluster's OCI registry: CNCF distribution (Debian's `docker-registry`) listening
on the cluster's gateway, so images pushed from the host are what its nodes pull. It
speaks plain HTTP, so the nodes list it in `registry.insecure`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx

REGISTRY_BIN = "/usr/bin/docker-registry"


def registry_config(storage: Path, address: str, port: int) -> str:
    """A distribution config: blobs under `storage` (deletes allowed), `address:port`."""
    return "\n".join(
        [
            "version: 0.1",
            "log:",
            "  level: warn",
            "  accesslog:",
            "    disabled: true",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {storage}",
            "  delete:",
            "    enabled: true",
            "http:",
            f"  addr: {address}:{port}",
            "  secret: agentenv-local-registry",
            "",
        ]
    )


def registry_argv(directory: Path, address: str, port: int) -> list[str]:
    """Write the config (storage under `directory`); the command that serves it."""
    storage = directory / "storage"
    storage.mkdir(parents=True, exist_ok=True)
    config = directory / "config.yml"
    config.write_text(registry_config(storage, address, port))
    return [REGISTRY_BIN, "serve", str(config)]


def wait_registry(url: str, alive: Callable[[], bool], timeout: float) -> None:
    """Until `url/v2/` answers; RuntimeError when the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError("the registry exited while starting")
        try:
            if httpx.get(f"{url}/v2/", timeout=1.0).status_code in (200, 401):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the registry did not answer within {timeout:.0f}s")
