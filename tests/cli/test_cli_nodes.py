"""`aenv node ls|drain|activate|rm|lost` against an httpx.MockTransport."""

from __future__ import annotations

from typing import Any

import httpx

NODES = [
    {"name": "node-1", "url": "http://a:1", "state": "active", "heartbeatAgeSeconds": 0.4,
     "capacity": {"running": 2, "paused": 1, "committed_memory_mb": 1024, "memory_mb": 8192}},
    {"name": "node-2", "url": "http://b:2", "state": "lost", "heartbeatAgeSeconds": 31.0,
     "capacity": {}},
]  # fmt: skip


LOST = [
    {"sandboxID": "i1", "templateID": "base", "node": "node-2", "state": "running",
     "reason": "it was running", "lostAt": "2026-12-06T10:00:00+00:00", "metadata": {}},
]  # fmt: skip


def handler(request: httpx.Request) -> httpx.Response:
    if request.method == "GET" and request.url.path == "/nodes":
        return httpx.Response(200, json=NODES)
    if request.method == "GET" and request.url.path == "/lost-sandboxes":
        return httpx.Response(200, json=LOST)
    if request.url.path == "/nodes/nope/drain":
        return httpx.Response(404, json={"code": 404, "message": "node 'nope' not found"})
    return httpx.Response(204)


def test_node_ls_table(cli: Any) -> None:
    run = cli(["node", "ls"], handler, tty=True)
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == [
        "NODE",
        "STATE",
        "URL",
        "RUNNING",
        "PAUSED",
        "MEMORY",
        "MB",
        "HEARTBEAT",
    ]
    assert lines[1].split() == ["node-1", "active", "http://a:1", "2", "1", "1024/8192", "0.4s"]
    assert lines[2].split()[:2] == ["node-2", "lost"]


def test_node_changes_hit_their_routes(cli: Any) -> None:
    for args, method, path in (
        (["node", "drain", "node-1"], "POST", "/nodes/node-1/drain"),
        (["node", "activate", "node-1"], "POST", "/nodes/node-1/activate"),
        (["node", "rm", "node-2"], "DELETE", "/nodes/node-2"),
    ):
        run = cli(args, handler)
        assert run.code == 0, run.stderr
        assert [(r.method, r.url.path) for r in run.requests] == [(method, path)]
    run = cli(["node", "drain", "nope"], handler)
    assert run.code != 0 and "not found" in run.stderr


def test_node_lost_lists_what_lost_nodes_took(cli: Any) -> None:
    run = cli(["node", "lost"], handler, tty=True)
    assert run.code == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["SANDBOX", "NODE", "STATE", "LOST", "AT", "REASON"]
    assert lines[1].split()[:4] == ["i1", "node-2", "running", "2026-12-06T10:00:00+00:00"]
    assert cli(["node", "lost", "-o", "json"], handler).stdout.strip().startswith("[")
