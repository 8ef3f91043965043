"""Fixtures for CLI unit tests: a Context wired to an httpx.MockTransport and in-memory streams."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from agentenv.cli.context import Context
from agentenv.cli.main import main

API_URL = "http://aenv.test"
API_KEY = "e2b_test"


class TtyStringIO(io.StringIO):
    """A text stream that claims to be a terminal."""

    def isatty(self) -> bool:
        return True


@dataclass
class Run:
    """The outcome of one CLI invocation."""

    code: int
    stdout: str
    stderr: str
    stdout_bytes: bytes
    stderr_bytes: bytes
    requests: list[httpx.Request] = field(default_factory=list)


Handler = Callable[[httpx.Request], httpx.Response]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for var in ("AENV_API_URL", "AENV_API_KEY", "AENV_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AENV_HOME", str(tmp_path / "aenv-home"))
    return home


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., Run]:
    """Run `aenv ARGV` against a handler; `tty=True` makes stdout look like a terminal."""

    def run(argv: list[str], handler: Handler, *, tty: bool = False) -> Run:
        seen: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            request.read()
            seen.append(request)
            return handler(request)

        stdout = TtyStringIO() if tty else io.StringIO()
        stderr = io.StringIO()
        out_bin, err_bin = io.BytesIO(), io.BytesIO()
        ctx = Context(
            env={"AENV_API_URL": API_URL, "AENV_API_KEY": API_KEY, "AENV_HOME": str(tmp_path)},
            transport=httpx.MockTransport(record),
            stdout=stdout,
            stderr=stderr,
            stdout_bin=out_bin,
            stderr_bin=err_bin,
        )
        code = main(argv, ctx)
        return Run(
            code, stdout.getvalue(), stderr.getvalue(), out_bin.getvalue(), err_bin.getvalue(), seen
        )

    return run
