"""A minimal asyncio client for QEMU's machine protocol (QMP) over a Unix socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from .driver import VmmError


class QmpClient:
    """One connection: greeting, capabilities negotiation, then commands in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def connect(cls, socket_path: Path, timeout: float = 5.0) -> QmpClient:
        """Connect, retrying until QEMU has created the socket or `timeout` passes."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(str(socket_path))
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise VmmError(f"QMP socket {socket_path} not ready: {exc}") from exc
                await asyncio.sleep(0.01)
        client = cls(reader, writer)
        try:
            async with asyncio.timeout(timeout):
                await client._read_message()  # greeting
                await client.execute("qmp_capabilities")
        except TimeoutError:
            await client.close()
            raise VmmError(f"QMP socket {socket_path}: no greeting within {timeout:.0f}s") from None
        except BaseException:
            await client.close()
            raise
        return client

    async def _read_message(self) -> dict[str, Any]:
        try:
            line = await self._reader.readline()
        except ConnectionError as exc:
            raise VmmError("QMP connection lost") from exc
        if not line:
            raise VmmError("QMP connection closed")
        return json.loads(line)

    async def execute(
        self, command: str, arguments: dict[str, Any] | None = None, timeout: float = 10.0
    ) -> Any:
        """Run one command and return its result; QMP errors, and no answer within
        `timeout` (a wedged VMM), raise VmmError."""
        message: dict[str, Any] = {"execute": command}
        if arguments:
            message["arguments"] = arguments
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(command, message)
        except TimeoutError:
            raise VmmError(f"QMP {command}: no answer within {timeout:.0f}s") from None

    async def _exchange(self, command: str, message: dict[str, Any]) -> Any:
        try:
            self._writer.write(json.dumps(message).encode() + b"\n")
            await self._writer.drain()
        except ConnectionError as exc:
            raise VmmError(f"QMP {command}: connection lost") from exc
        while True:
            reply = await self._read_message()
            if "event" in reply:
                continue
            if "error" in reply:
                raise VmmError(f"QMP {command}: {reply['error'].get('desc', reply['error'])}")
            return reply.get("return")

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (ConnectionError, BrokenPipeError):
            pass
