"""`aenv exec` and file transfer over the envd proxy, from canned Connect streams."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentenv.guest.rpc import FLAG_END_STREAM, EnvelopeDecoder, encode_envelope

TOKEN = "envd-token"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def connect_stream(
    *messages: dict[str, Any], trailer: dict[str, Any] | None = None
) -> httpx.Response:
    body = b"".join(encode_envelope(m) for m in messages)
    body += encode_envelope(trailer or {}, FLAG_END_STREAM)
    return httpx.Response(200, content=body, headers={"content-type": "application/connect+json"})


def ev(**event: Any) -> dict[str, Any]:
    return {"event": event}


def envd_handler(stream: httpx.Response, calls: list[tuple[str, Any]] | None = None) -> Any:
    """Answer the sandbox lookup, then `Start` with `stream`; other RPCs with `{}`."""

    def handler(request: httpx.Request) -> httpx.Response:
        if "e2b-sandbox-id" not in request.headers:
            assert request.url.path == "/sandboxes/sb1"
            return httpx.Response(200, json={"sandboxID": "sb1", "envdAccessToken": TOKEN})
        assert request.headers["e2b-sandbox-id"] == "sb1"
        assert request.headers["e2b-sandbox-port"] == "49983"
        assert request.headers["x-access-token"] == TOKEN
        assert "x-api-key" not in request.headers
        if request.url.path == "/process.Process/Start":
            assert request.headers["content-type"] == "application/connect+json"
            assert request.headers["connect-protocol-version"] == "1"
            (env,) = EnvelopeDecoder().feed(request.content)
            if calls is not None:
                calls.append(("Start", env.message))
            return stream
        if calls is not None:
            calls.append((request.url.path, json.loads(request.content)))
        return httpx.Response(200, json={})

    return handler


def test_exec_streams_and_propagates_exit_code(cli: Any) -> None:
    calls: list[tuple[str, Any]] = []
    stream = connect_stream(
        ev(start={"pid": 42}),
        ev(data={"stdout": b64(b"hello ")}),
        ev(data={"stderr": b64(b"oops\n")}),
        ev(keepalive={}),
        ev(data={"stdout": b64(b"world\n")}),
        ev(
            end={"exitCode": 3, "exited": True, "status": "exit status 3", "error": "exit status 3"}
        ),
    )
    run = cli(
        ["exec", "sb1", "--cwd", "/tmp", "--env", "A=1", "--", "echo", "a b", "-n"],
        envd_handler(stream, calls),
    )
    assert run.code == 3
    assert run.stdout_bytes == b"hello world\n"
    assert run.stderr_bytes == b"oops\n"
    assert calls == [
        (
            "Start",
            {
                # Several arguments run as they are, without a shell (as `docker exec`).
                "process": {
                    "cmd": "echo",
                    "args": ["a b", "-n"],
                    "envs": {"A": "1"},
                    "cwd": "/tmp",
                },
                "stdin": False,
            },
        )
    ]


def test_exec_single_argument_is_a_script(cli: Any) -> None:
    calls: list[tuple[str, Any]] = []
    stream = connect_stream(
        ev(start={"pid": 1}), ev(end={"exited": True, "status": "exit status 0"})
    )
    run = cli(["exec", "sb1", "--", "echo $HOME | wc -c"], envd_handler(stream, calls))
    assert run.code == 0  # missing exitCode means 0
    assert calls[0][1]["process"]["args"] == ["-l", "-c", "echo $HOME | wc -c"]
    assert "cwd" not in calls[0][1]["process"]


def test_exec_without_double_dash(cli: Any) -> None:
    calls: list[tuple[str, Any]] = []
    stream = connect_stream(ev(start={"pid": 1}), ev(end={"exited": True}))
    assert cli(["exec", "sb1", "true"], envd_handler(stream, calls)).code == 0
    assert calls[0][1]["process"]["args"] == ["-l", "-c", "true"]


def test_exec_user_header(cli: Any) -> None:
    seen: list[httpx.Request] = []
    stream = connect_stream(ev(start={"pid": 1}), ev(end={"exited": True}))
    handler = envd_handler(stream)

    def spy(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    assert cli(["exec", "sb1", "--user", "root", "--timeout", "5", "--", "id"], spy).code == 0
    start = seen[-1]
    assert start.headers["authorization"] == "Basic " + b64(b"root:")
    assert start.headers["connect-timeout-ms"] == "5000"


def test_exec_killed_by_signal(cli: Any) -> None:
    stream = connect_stream(
        ev(start={"pid": 9}),
        ev(
            end={
                "exitCode": -1,
                "exited": False,
                "status": "signal: killed",
                "error": "signal: killed",
            }
        ),
    )
    run = cli(["exec", "sb1", "--", "sleep", "100"], envd_handler(stream))
    assert run.code == 137
    assert "signal: killed" in run.stderr


def test_exec_without_end_event(cli: Any) -> None:
    stream = connect_stream(ev(start={"pid": 9}), ev(data={"stdout": b64(b"partial")}))
    run = cli(["exec", "sb1", "--", "x"], envd_handler(stream))
    assert run.code == 1
    assert run.stdout_bytes == b"partial"
    assert "without an end event" in run.stderr


def test_exec_trailer_error(cli: Any) -> None:
    trailer = {"error": {"code": "invalid_argument", "message": "cwd /nope does not exist"}}
    stream = connect_stream(trailer=trailer)
    run = cli(["exec", "sb1", "--cwd", "/nope", "--", "ls"], envd_handler(stream))
    assert run.code == 1
    assert "invalid_argument: cwd /nope does not exist" in run.stderr


def test_exec_http_error_before_stream(cli: Any) -> None:
    gone = httpx.Response(502, json={"code": 502, "message": "The sandbox sb1 was not found"})
    run = cli(["exec", "sb1", "--", "ls"], envd_handler(gone))
    assert run.code == 1
    assert "The sandbox sb1 was not found" in run.stderr


def test_exec_requires_command(cli: Any) -> None:
    run = cli(["exec", "sb1"], envd_handler(connect_stream()))
    assert run.code == 2


def test_cn_requires_tty(cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.isatty", lambda fd: False)
    run = cli(["cn", "sb1"], envd_handler(connect_stream()))
    assert run.code == 1
    assert "not a TTY" in run.stderr
    assert run.requests == []


def test_upload_streams_file(cli: Any, tmp_path: Path) -> None:
    local = tmp_path / "big.bin"
    payload = bytes(range(256)) * 4096  # 1 MiB: sent in several chunks
    local.write_bytes(payload)
    got: dict[str, Any] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        if "e2b-sandbox-id" not in request.headers:
            return httpx.Response(200, json={"sandboxID": "sb1", "envdAccessToken": TOKEN})
        got["path"] = request.url.params["path"]
        got["ctype"] = request.headers["content-type"]
        got["length"] = request.headers.get("content-length")
        got["body"] = request.content
        return httpx.Response(200, json=[{"name": "f", "type": "file", "path": "/home/user/f"}])

    run = cli(["upload", "sb1", str(local), "f"], handler)
    assert run.code == 0, run.stderr
    assert got == {
        "path": "f",
        "ctype": "application/octet-stream",
        "length": str(len(payload)),
        "body": payload,
    }
    assert "/home/user/f" in run.stdout


def test_download_into_directory(cli: Any, tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if "e2b-sandbox-id" not in request.headers:
            return httpx.Response(200, json={"sandboxID": "sb1"})
        assert "x-access-token" not in request.headers
        assert request.url.params["path"] == "/etc/hostname"
        return httpx.Response(200, content=b"sb1\n")

    run = cli(["download", "sb1", "/etc/hostname", str(tmp_path)], handler)
    assert run.code == 0, run.stderr
    assert (tmp_path / "hostname").read_bytes() == b"sb1\n"
    assert not list(tmp_path.glob(".*part"))


def test_download_missing_file(cli: Any, tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if "e2b-sandbox-id" not in request.headers:
            return httpx.Response(200, json={"sandboxID": "sb1"})
        return httpx.Response(404, json={"code": 404, "message": "file /x not found"})

    run = cli(["download", "sb1", "/x", str(tmp_path / "x")], handler)
    assert run.code == 1
    assert "file /x not found" in run.stderr
    assert not (tmp_path / "x").exists()
