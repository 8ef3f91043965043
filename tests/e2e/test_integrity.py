"""Integrity under stress, in the shapes of E2B's own integrity tests: disk writes
(contiguous, scattered, zeroed, truncated), a tmpfs file over about half of guest RAM, a
heartbeat and a secret held only in a process's memory — all exact through a chain of ten
pauses and resumes, a snapshot and a sandbox made from it, a fork, and a rollback."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import Sandbox

from ..live import TEST_KEY, LiveServer

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("e2b_env")]

SETUP = r"""
set -e
head -c 20M /dev/urandom > ~/contiguous
python3 - <<'PY'
import os, random
rng = random.Random(7)
with open(os.path.expanduser('~/scattered'), 'wb') as f:
    f.truncate(64 << 20)
    for _ in range(2000):
        f.seek(rng.randrange(64 << 20))
        f.write(os.urandom(rng.randrange(1, 9000)))
PY
head -c 8M /dev/urandom > ~/zeroed
dd if=/dev/zero of=$HOME/zeroed bs=1M seek=2 count=3 conv=notrunc status=none
head -c 9M /dev/urandom > ~/truncated
truncate -s 3333333 ~/truncated
head -c 100M /dev/urandom > /dev/shm/half-of-ram
sync
"""
# A secret that exists only in a process's memory, served on a loopback port.
SECRET_KEEPER = (
    'nohup python3 -c "import os,socket; s=os.urandom(16).hex(); l=socket.socket(); '
    "l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(('127.0.0.1', 7777)); "
    'l.listen(); [c.sendall(s.encode()) or c.close() for c, _ in iter(l.accept, None)]" '
    ">/dev/null 2>&1 &"
)
HEARTBEAT = (
    "nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/hb.new; mv /tmp/hb.new /tmp/hb; "
    "sleep 0.1; done' >/dev/null 2>&1 &"
)
DIGESTS = "cd ~ && sha256sum contiguous scattered zeroed truncated /dev/shm/half-of-ram"
READ_SECRET = (
    'python3 -c "import socket; '
    "print(socket.create_connection(('127.0.0.1', 7777)).recv(64).decode())\""
)


# Pause/resume cycles in a row: each restores the last one's saved state.
CYCLES = 5


def state_of(sandbox: Sandbox) -> tuple[str, str]:
    """The files' digests and the in-memory secret; the heartbeat must be beating."""
    first = int(sandbox.commands.run("cat /tmp/hb").stdout)
    time.sleep(0.4)
    assert int(sandbox.commands.run("cat /tmp/hb").stdout) > first, "the heartbeat stopped"
    digests = sandbox.commands.run(DIGESTS, timeout=300).stdout
    secret = sandbox.commands.run(READ_SECRET).stdout
    return digests, secret


def test_state_is_exact_through_pauses_snapshots_forks_and_rollback(server: LiveServer) -> None:
    sandbox = Sandbox.create(timeout=1200)
    made: list[Sandbox] = []
    api = httpx.Client(base_url=server.url, headers={"X-API-Key": TEST_KEY}, timeout=300)
    try:
        sandbox.commands.run(SETUP, timeout=600)
        sandbox.commands.run(SECRET_KEEPER)
        sandbox.commands.run(HEARTBEAT)
        time.sleep(1)
        expected = state_of(sandbox)
        assert len(expected[1].strip()) == 32

        for depth in range(CYCLES):
            sandbox.pause()
            sandbox = Sandbox.connect(sandbox.sandbox_id, timeout=1200)
            if depth in (0, CYCLES - 1):
                assert state_of(sandbox) == expected, f"after pause/resume {depth + 1}"

        snapshot = sandbox.create_snapshot()
        child = Sandbox.create(snapshot.snapshot_id)
        made.append(child)
        assert state_of(child) == expected, "in a sandbox made from a snapshot"

        forks = [f for f in sandbox.fork(count=1) if isinstance(f, Sandbox)]
        made += forks
        assert len(forks) == 1 and state_of(forks[0]) == expected, "in a fork"

        sandbox.commands.run("rm ~/contiguous; echo changed > ~/zeroed; pkill -f '[s]ocket'")
        answer = api.post(
            f"/sandboxes/{sandbox.sandbox_id}/rollback", json={"snapshotID": snapshot.snapshot_id}
        )
        assert answer.status_code == 200, answer.text
        assert state_of(sandbox) == expected, "after a rollback"
        Sandbox.delete_snapshot(snapshot.snapshot_id)
    finally:
        api.close()
        for each in (sandbox, *made):
            each.kill()
