"""The host's client for the guest agent: health, init, and processes it runs for the host."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from ..errors import Unavailable
from ..wire import ACCESS_TOKEN_HEADER, ENVD_FILES_ROUTE, ENVD_HEALTH_ROUTE
from .agent import init_secret
from .rpc import ConnectError, EnvelopeDecoder, encode_envelope, error_from_json

# Seconds the host waits for the guest's own routes (/init, /reclaim, /sync).
HOST_CALL_TIMEOUT = 30.0
# Seconds a health poll waits for its connection: a guest not up yet refuses or drops it.
CONNECT_TIMEOUT = 1.0
# Seconds between the keepalives the agent sends on a quiet process stream.
KEEPALIVE_SECONDS = 30


class AgentClient:
    """Talks to one guest agent at `base_url` (reached through the sandbox's namespace)."""

    def __init__(
        self,
        base_url: str,
        access_token: str | None = None,
        timeout: float = 5.0,
        *,
        init_secret: str | None = None,
        reclaim_after_idle: float | None = None,
    ) -> None:
        self._base_url = base_url
        self._headers = {ACCESS_TOKEN_HEADER: access_token} if access_token else {}
        self._timeout = timeout
        self._init_secret = init_secret
        # Handed over with every /init: seconds of idle before the guest gives memory back.
        self._reclaim_after_idle = reclaim_after_idle

    async def healthy(self, answer_within: float = CONNECT_TIMEOUT) -> bool:
        """One `GET /health` over a bare connection (polled during boot: a refused or reset
        connection is the normal answer then, and httpx's stack mishandles some of those).
        Once connected, the agent has `answer_within` seconds to answer."""
        url = httpx.URL(self._base_url)
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_connection(url.host, url.port)
            try:
                async with asyncio.timeout(answer_within):
                    writer.write(
                        f"GET {ENVD_HEALTH_ROUTE} HTTP/1.0\r\nHost: agent\r\n\r\n".encode()
                    )
                    status = await reader.readline()
            finally:
                writer.close()
        except (OSError, TimeoutError):
            return False
        return status.split(b" ")[1:2] == [b"204"]

    async def init(
        self,
        env_vars: dict[str, str],
        access_token: str | None,
        *,
        user: str | None = None,
        workdir: str | None = None,
        volume_mounts: list[dict[str, str]] | None = None,
        trusted_ca: str | None = None,
    ) -> None:
        """Hand the agent the sandbox's environment, token, defaults, clock and entropy,
        the volumes it mounts (E2B's envd `volumeMounts`) and the egress CA it trusts."""
        body: dict[str, object] = {
            "envVars": env_vars,
            "timestamp": datetime.now(UTC).isoformat(),
            # Clones of one boot snapshot share the kernel's random state until reseeded.
            "entropy": base64.b64encode(os.urandom(64)).decode(),
        }
        if access_token:
            body["accessToken"] = access_token
        if user:
            body["defaultUser"] = user
        if workdir:
            body["defaultWorkdir"] = workdir
        if volume_mounts:
            body["volumeMounts"] = volume_mounts
        if trusted_ca:
            body["trustedCa"] = trusted_ca
        if self._reclaim_after_idle is not None:
            body["reclaimAfterIdle"] = self._reclaim_after_idle
        await self._host_call("/init", body)

    async def reclaim(self) -> int:
        """The guest drops clean caches now; bytes it freed."""
        return int((await self._host_call("/reclaim", None)).json()["freed"])

    async def sync(self) -> None:
        """The guest flushes its file systems to disk (before a filesystem-only snapshot)."""
        await self._host_call("/sync", None)

    async def _host_call(self, path: str, body: dict[str, object] | None) -> httpx.Response:
        """POST to a route that is the host's alone: it carries the init secret. Whatever
        goes wrong (no answer, the guest's own failure) is Unavailable, with the reason."""
        headers = {init_secret.HEADER: self._init_secret or ""}
        # Longer than other calls: on a loaded host a guest can take seconds to mount its
        # disk or drop its caches, and it has already answered its health check.
        timeout = max(self._timeout, HOST_CALL_TIMEOUT)
        async with httpx.AsyncClient(base_url=self._base_url, timeout=timeout) as client:
            try:
                response = await client.post(path, json=body, headers=headers)
            except httpx.TransportError as exc:
                detail = str(exc) or type(exc).__name__
                raise Unavailable(f"the sandbox's guest did not answer {path}: {detail}") from exc
            if response.status_code >= 400:
                # The guest's own reason (a volume it could not mount, say) is the error.
                try:
                    reason = str(response.json()["message"])
                except (ValueError, KeyError, TypeError):
                    reason = response.text[:500]
                raise Unavailable(f"the sandbox's guest failed {path}: {reason}")
            return response

    async def metrics(self) -> dict[str, Any]:
        """The agent's current CPU, memory and disk figures."""
        return (await self._get("/metrics")).json()

    async def logs(self, start_ms: int) -> list[dict[str, Any]]:
        """The sandbox's log entries at or after `start_ms`, oldest first."""
        return (await self._get("/logs", {"start": str(start_ms)})).json()["entries"]

    async def _get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        async with httpx.AsyncClient(
            base_url=self._base_url, headers=self._headers, timeout=self._timeout
        ) as client:
            response = await client.get(path, params=params)
            response.raise_for_status()
            return response

    async def write_file(self, path: str, data: bytes, user: str = "root") -> None:
        """Write `data` to `path` in the guest as `user` (parents are made)."""
        async with httpx.AsyncClient(
            base_url=self._base_url, headers=self._headers, timeout=max(self._timeout, 120.0)
        ) as client:
            response = await client.post(
                ENVD_FILES_ROUTE,
                params={"path": path, "username": user},
                content=data,
                headers={"Content-Type": "application/octet-stream"},
            )
            response.raise_for_status()

    async def start_detached(
        self, argv: list[str], tag: str, *, user: str | None = None, cwd: str | None = None
    ) -> int:
        """Start a process that outlives this call (the agent keeps it); returns its pid."""
        async for event in self._start(argv, tag=tag, user=user, cwd=cwd, env=None, timeout=None):
            if "start" in event:
                # Leaving now detaches: agent processes survive their stream.
                return int(event["start"].get("pid", 0))
        raise ConnectError("internal", f"start {argv[0]}: the agent sent no start event")

    async def run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        output: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> int:
        """Run a process to its end, handing each line of its output to `output`; its exit
        code (-1 when a signal ended it). ConnectError when it cannot start."""
        lines = _LineSplitter(output)
        async for event in self._start(
            argv, tag=None, user=user, cwd=cwd, env=env, timeout=timeout
        ):
            data = event.get("data")
            if data:
                for stream in ("stdout", "stderr"):
                    if data.get(stream):
                        lines.feed(base64.b64decode(data[stream]))
            end = event.get("end")
            if end is not None:
                lines.flush()
                # Protobuf's JSON leaves a zero exit code out; a signal's end has exited false.
                return int(end.get("exitCode", 0)) if end.get("exited") else -1
        raise ConnectError("internal", f"{argv[0]}: the stream ended before the process did")

    async def _start(
        self,
        argv: list[str],
        *,
        tag: str | None,
        user: str | None,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout: float | None,
    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one `process.Process/Start` stream, as they come."""
        process: dict[str, Any] = {"cmd": argv[0], "args": argv[1:]}
        if cwd:
            process["cwd"] = cwd
        if env:
            process["envs"] = env
        message: dict[str, Any] = {"process": process, "stdin": False}
        if tag:
            message["tag"] = tag
        headers = {
            **self._headers,
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
            # Asked for, as E2B's SDKs ask: without it the agent sends none, and a step
            # quiet for longer than the read timeout (pip installing) would end its build.
            "Keepalive-Ping-Interval": str(KEEPALIVE_SECONDS),
        }
        if user:
            headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:".encode()).decode()
        decoder = EnvelopeDecoder()
        # The agent sends keepalives while a process is quiet: the read timeout holds.
        limits = httpx.Timeout(self._timeout, read=max(self._timeout, 3 * KEEPALIVE_SECONDS))
        async with (
            httpx.AsyncClient(base_url=self._base_url, timeout=limits) as client,
            asyncio.timeout(timeout),
            client.stream(
                "POST", "/process.Process/Start", content=encode_envelope(message), headers=headers
            ) as response,
        ):
            if response.status_code != 200:
                raise error_from_json(_json_or_text(await response.aread()), response.status_code)
            async for chunk in response.aiter_raw():
                for envelope in decoder.feed(chunk):
                    if envelope.end_stream:
                        error = envelope.message.get("error")
                        if error:
                            raise error_from_json(error)
                        return
                    yield envelope.message.get("event", {})


def _json_or_text(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode(errors="replace")


class _LineSplitter:
    """Cuts a byte stream into text lines for a callback (a partial line waits)."""

    def __init__(self, output: Callable[[str], None] | None) -> None:
        self._output = output
        self._partial = b""

    def feed(self, data: bytes) -> None:
        if self._output is None:
            return
        *whole, self._partial = (self._partial + data).split(b"\n")
        for line in whole:
            self._output(line.decode(errors="replace").rstrip("\r"))

    def flush(self) -> None:
        if self._output is not None and self._partial:
            self._output(self._partial.decode(errors="replace"))
        self._partial = b""
