"""The PTY input pump: batched SendInput, Update on resize, keep-alive while in use."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from agentenv.cli import terminal
from agentenv.cli.client import EnvdClient
from agentenv.cli.terminal import InputPump, pty_start_request


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def test_pty_start_request() -> None:
    assert pty_start_request({"cols": 100, "rows": 30}, "xterm") == {
        "process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": {"TERM": "xterm"}},
        "pty": {"size": {"cols": 100, "rows": 30}},
    }


def test_input_pump(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(terminal, "KEEPALIVE_INTERVAL", 0.0)
    calls: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["content-type"] == "application/json"
        assert request.headers["x-access-token"] == "tok"
        with lock:
            calls.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={})

    keepalives: list[float] = []
    envd = EnvdClient("http://h", "sb", "tok", transport=httpx.MockTransport(handler))
    stdin_r, stdin_w = os.pipe()
    wake_r, wake_w = os.pipe()
    pump = InputPump(envd, 42, stdin_r, wake_r, keepalive=lambda: keepalives.append(1))
    try:
        os.write(stdin_w, b"ls -la\r")
        pump.start()
        wait_for(lambda: len(calls) >= 1)
        path, body = calls[0]
        assert path == "/process.Process/SendInput"
        typed = base64.b64encode(b"ls -la\r").decode()
        assert body == {"process": {"pid": 42}, "input": {"pty": typed}}
        wait_for(lambda: len(keepalives) == 1)
        os.write(wake_w, b"w")  # what the SIGWINCH handler does
        wait_for(lambda: any(p == "/process.Process/Update" for p, _ in calls))
        update = next(b for p, b in calls if p == "/process.Process/Update")
        assert update["process"] == {"pid": 42}
        assert set(update["pty"]["size"]) == {"cols", "rows"}
        time.sleep(0.1)
        assert len(keepalives) == 1  # no new input since: no further keep-alive
    finally:
        pump.stop()
        os.write(wake_w, b"x")
        pump.join(timeout=5)
        for fd in (stdin_r, stdin_w, wake_r, wake_w):
            os.close(fd)
        envd.close()
    assert not pump.is_alive()


def test_input_pump_stops_at_eof() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(200))
    envd = EnvdClient("http://h", "sb", transport=transport)
    stdin_r, stdin_w = os.pipe()
    wake_r, wake_w = os.pipe()
    os.close(stdin_w)
    pump = InputPump(envd, 1, stdin_r, wake_r)
    pump.start()
    pump.join(timeout=5)
    assert not pump.is_alive()
    for fd in (stdin_r, wake_r, wake_w):
        os.close(fd)
