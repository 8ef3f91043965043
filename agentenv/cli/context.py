"""What every command gets: credentials, I/O streams, and clients on an injectable transport."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import BinaryIO, TextIO
from urllib.parse import urlsplit

import httpx

from agentenv.cli.client import ApiClient, EnvdClient
from agentenv.cli.credentials import Credentials, load_credentials
from agentenv.config import load_config


class CliError(Exception):
    """A failure to report as `error: <message>` with the given exit code."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def local_server_key(env: Mapping[str, str]) -> str:
    """The key a server on this host generated (`<home>/secrets/api-key`), if readable."""
    try:
        home = load_config(env=dict(env)).home
        return (home / "secrets" / "api-key").read_text().strip()
    except (OSError, ValueError):
        return ""


def _stdout_bin() -> BinaryIO:
    return sys.stdout.buffer


def _stderr_bin() -> BinaryIO:
    return sys.stderr.buffer


@dataclass
class Context:
    """Shared state of one CLI invocation; tests replace the transport and streams."""

    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    transport: httpx.BaseTransport | None = None
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    stdout_bin: BinaryIO = field(default_factory=_stdout_bin)
    stderr_bin: BinaryIO = field(default_factory=_stderr_bin)

    @cached_property
    def creds(self) -> Credentials:
        try:
            creds = load_credentials(self.env)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        if not creds.key and urlsplit(creds.url).hostname in _LOCAL_HOSTS:
            creds = Credentials(creds.url, local_server_key(self.env))
        return creds

    def api(self) -> ApiClient:
        return ApiClient(self.creds.url, self.creds.key, transport=self.transport)

    def envd(
        self, sandbox_id: str, access_token: str | None = None, user: str | None = None
    ) -> EnvdClient:
        """An envd client; looks the access token up with `GET /sandboxes/{id}` if not given."""
        if access_token is None:
            with self.api() as api:
                access_token = api.get_sandbox(sandbox_id).get("envdAccessToken") or ""
        return EnvdClient(
            self.creds.url, sandbox_id, access_token, user=user, transport=self.transport
        )

    def warn(self, message: str) -> None:
        self.stdout.flush()
        self.stderr.write(f"{message}\n")
        self.stderr.flush()
