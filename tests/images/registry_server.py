"""A real OCI registry for tests: CNCF distribution (`docker-registry`) on a loopback port.

Storage is a plain directory, so tests can look at (or corrupt) stored blobs. Basic auth uses
an htpasswd file made with `htpasswd -B` (Debian package apache2-utils).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from agentenv.cluster.registry import REGISTRY_BIN, registry_config, wait_registry

__all__ = [
    "REGISTRY_BIN",
    "FakeRequest",
    "FakeServer",
    "Registry",
    "image_routes",
    "require_registry",
    "running_registry",
]

HTPASSWD_BIN = "/usr/bin/htpasswd"
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0


def require_registry(auth: bool = False) -> None:
    """Skip the calling test when the registry (or htpasswd, for auth) is not installed."""
    if not os.access(REGISTRY_BIN, os.X_OK):
        pytest.skip(f"{REGISTRY_BIN} missing: apt-get install docker-registry")
    if auth and not os.access(HTPASSWD_BIN, os.X_OK):
        pytest.skip(f"{HTPASSWD_BIN} missing: apt-get install apache2-utils")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """One `docker-registry serve` process with its own storage under `root`."""

    def __init__(self, root: Path, users: Mapping[str, str] | None = None) -> None:
        self.root = root
        self.users = dict(users or {})
        self.storage = root / "storage"
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        """`127.0.0.1:<port>`: the registry part of an image reference."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @property
    def auth(self) -> tuple[str, str] | None:
        """Some (user, password) that may push, or None for an open registry."""
        return next(iter(self.users.items()), None)

    def blob_path(self, digest: str) -> Path:
        """Where filesystem storage keeps a blob's bytes (distribution's on-disk layout)."""
        algorithm, _, hexdigest = digest.partition(":")
        return (
            self.storage
            / "docker/registry/v2/blobs"
            / algorithm
            / hexdigest[:2]
            / hexdigest
            / "data"
        )

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(exist_ok=True)
        self.port = _free_port()
        config = self.root / "config.yml"
        config.write_text(self._config())
        log = open(self.root / "registry.log", "wb")  # the child keeps its own copy
        self._proc = subprocess.Popen(
            [REGISTRY_BIN, "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, so stop() can end exactly it
        )
        log.close()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)

    def __enter__(self) -> Registry:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_text(self) -> str:
        path = self.root / "registry.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _config(self) -> str:
        text = registry_config(self.storage, "127.0.0.1", self.port)
        if self.users:
            htpasswd = self.root / "htpasswd"
            htpasswd.write_text("".join(_bcrypt_line(u, p) for u, p in self.users.items()))
            text += f"auth:\n  htpasswd:\n    realm: agentenv-test\n    path: {htpasswd}\n"
        return text

    def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None
        try:
            wait_registry(self.url, lambda: proc.poll() is None, START_TIMEOUT)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}:\n{self.log_text()}") from exc


def _bcrypt_line(user: str, password: str) -> str:
    """One htpasswd line with a bcrypt hash, the only kind distribution accepts."""
    out = subprocess.run(
        [shutil.which("htpasswd") or HTPASSWD_BIN, "-nbB", user, password],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() + "\n"


@contextlib.contextmanager
def running_registry(root: Path, users: Mapping[str, str] | None = None) -> Iterator[Registry]:
    """A started registry, stopped on exit; skips the test if the binary is missing."""
    require_registry(auth=bool(users))
    registry = Registry(root, users)
    registry.start()
    try:
        yield registry
    finally:
        registry.stop()


@dataclass(frozen=True)
class FakeRequest:
    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]


Reply = tuple[int, Mapping[str, str], bytes]


class FakeServer:
    """A scripted HTTP server on loopback, for behaviour a real registry will not show.

    `handler(request) -> (status, headers, body)` answers every request; all are recorded.
    """

    def __init__(self, handler: Callable[[FakeRequest], Reply]) -> None:
        self.handler = handler
        self.requests: list[FakeRequest] = []
        server = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                parts = urlsplit(self.path)
                request = FakeRequest(
                    self.command,
                    parts.path,
                    parse_qs(parts.query),
                    {k.lower(): v for k, v in self.headers.items()},
                )
                server.requests.append(request)
                status, headers, body = server.handler(request)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                if "Content-Length" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = _serve

            def log_message(self, *args: object) -> None:
                pass  # keep test output quiet

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def paths(self, method: str = "GET") -> list[str]:
        return [r.path for r in self.requests if r.method == method]

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def image_routes(repository: str, tag: str, image: object) -> dict[str, tuple[str, bytes]]:
    """`/v2/...` path -> (content type, body) for a BuiltImage from oci_build."""
    manifest = (image.media_type, image.manifest)  # type: ignore[attr-defined]
    routes = {
        f"/v2/{repository}/manifests/{tag}": manifest,
        f"/v2/{repository}/manifests/{image.digest}": manifest,  # type: ignore[attr-defined]
        f"/v2/{repository}/blobs/{image.config_digest}": (  # type: ignore[attr-defined]
            "application/octet-stream",
            image.config,  # type: ignore[attr-defined]
        ),
    }
    for layer in image.layers:  # type: ignore[attr-defined]
        routes[f"/v2/{repository}/blobs/{layer.digest}"] = ("application/octet-stream", layer.blob)
    return routes
