"""The host's client for the guest agent's plain HTTP endpoints (health, init)."""

from __future__ import annotations

import asyncio
import base64
import os
from datetime import UTC, datetime
from typing import Any

import httpx

from .agent import init_secret
from .rpc import EnvelopeDecoder, encode_envelope


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
        self._headers = {"X-Access-Token": access_token} if access_token else {}
        self._timeout = timeout
        self._init_secret = init_secret
        # Handed over with every /init: seconds of idle before the guest gives memory back.
        self._reclaim_after_idle = reclaim_after_idle

    async def healthy(self) -> bool:
        """One `GET /health` over a bare connection (polled during boot: a refused or reset
        connection is the normal answer then, and httpx's stack mishandles some of those)."""
        url = httpx.URL(self._base_url)
        try:
            async with asyncio.timeout(1.0):
                reader, writer = await asyncio.open_connection(url.host, url.port)
                try:
                    writer.write(b"GET /health HTTP/1.0\r\nHost: agent\r\n\r\n")
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
    ) -> None:
        """Hand the agent the sandbox's environment, token, defaults, clock and entropy."""
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
        if self._reclaim_after_idle is not None:
            body["reclaimAfterIdle"] = self._reclaim_after_idle
        await self._host_call("/init", body)

    async def reclaim(self) -> int:
        """The guest drops clean caches and compacts free memory now; bytes it freed."""
        return int((await self._host_call("/reclaim", None)).json()["freed"])

    async def sync(self) -> None:
        """The guest flushes its file systems to disk (before a filesystem-only snapshot)."""
        await self._host_call("/sync", None)

    async def _host_call(self, path: str, body: dict[str, object] | None) -> httpx.Response:
        """POST to a route that is the host's alone: it carries the init secret."""
        headers = {init_secret.HEADER: self._init_secret or ""}
        async with httpx.AsyncClient(base_url=self._base_url, timeout=self._timeout) as client:
            response = await client.post(path, json=body, headers=headers)
            response.raise_for_status()
            return response

    async def metrics(self) -> dict[str, Any]:
        """The agent's current CPU, memory and disk figures."""
        async with httpx.AsyncClient(
            base_url=self._base_url, headers=self._headers, timeout=self._timeout
        ) as client:
            response = await client.get("/metrics")
            response.raise_for_status()
            return response.json()

    async def start_detached(self, argv: list[str], tag: str) -> int:
        """Start a process that outlives this call (the agent keeps it); returns its pid."""
        message = {"process": {"cmd": argv[0], "args": argv[1:]}, "tag": tag, "stdin": False}
        headers = {
            **self._headers,
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
        }
        decoder = EnvelopeDecoder()
        async with (
            httpx.AsyncClient(base_url=self._base_url, timeout=self._timeout) as client,
            client.stream(
                "POST", "/process.Process/Start", content=encode_envelope(message), headers=headers
            ) as response,
        ):
            if response.status_code != 200:
                await response.aread()
                raise httpx.HTTPStatusError(
                    f"start {argv[0]}: {response.text}", request=response.request, response=response
                )
            async for chunk in response.aiter_raw():
                for envelope in decoder.feed(chunk):
                    start = envelope.message.get("event", {}).get("start")
                    if start is not None:
                        # Leaving now detaches: agent processes survive their stream.
                        return int(start.get("pid", 0))
        raise httpx.HTTPError(f"start {argv[0]}: the agent sent no start event")
