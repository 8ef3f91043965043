"""The interactive CLI driven under a real terminal (tmux): start, type, resize, Ctrl-D, cn."""

from __future__ import annotations

import re
import shlex
import subprocess
import uuid

import pytest

from ..live import AENV, TEST_KEY, LiveServer, wait_for

pytestmark = pytest.mark.vm


class Tmux:
    """One detached tmux session running a command, read through capture-pane. Each has a
    tmux server of its own: a session started while another's server exits can fail."""

    def __init__(self, command: str, cols: int = 100, rows: int = 30) -> None:
        self.name = f"aenv-{uuid.uuid4().hex[:8]}"
        self.tmux = ["tmux", "-L", self.name]
        subprocess.run(
            [*self.tmux, "new-session", "-d", "-s", self.name, "-x", str(cols), "-y", str(rows),
             f"{command}; echo EXIT=$?; sleep 60"],
            check=True,
        )  # fmt: skip
        subprocess.run([*self.tmux, "set-option", "-t", self.name, "status", "off"], check=True)

    def screen(self) -> str:
        return subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-J", "-S", "-200", "-t", self.name],
            capture_output=True,
            text=True,
        ).stdout

    def type(self, *keys: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        found = wait_for(lambda: re.search(pattern, self.screen(), re.M), timeout, interval=0.3)
        assert found, f"{pattern!r} not on screen:\n{self.screen().rstrip()}"
        match = re.search(pattern, self.screen(), re.M)
        assert match
        return match

    def resize(self, cols: int, rows: int) -> None:
        subprocess.run(
            [*self.tmux, "resize-window", "-t", self.name, "-x", str(cols), "-y", str(rows)],
            check=True,
        )

    def close(self) -> None:
        subprocess.run([*self.tmux, "kill-server", "-t", self.name], check=False)


def test_start_type_resize_detach_and_reattach(server: LiveServer) -> None:
    env = f"AENV_API_URL={server.url} AENV_API_KEY={TEST_KEY}"
    term = Tmux(f"env {env} {shlex.quote(AENV)} start base")
    try:
        sandbox_id = term.wait_for(r"sandbox (i[a-z0-9]{19}) started", 240).group(1)
        term.wait_for(r"\$ *$", 120)
        term.type("echo answer=$((6*7))", "Enter")
        term.wait_for(r"answer=42")
        term.resize(132, 40)
        term.type("stty size", "Enter")
        term.wait_for(r"^40 132$")
        term.type("C-d")
        term.wait_for(r"EXIT=0")
    finally:
        term.close()

    again = Tmux(f"env {env} {shlex.quote(AENV)} cn {sandbox_id}")
    try:
        again.wait_for(r"\$ *$", 120)
        again.type("cat /etc/hostname; exit 3", "Enter")
        again.wait_for(r"EXIT=3")
    finally:
        again.close()
    with server.client() as api:
        assert api.delete(f"/sandboxes/{sandbox_id}").status_code == 204
