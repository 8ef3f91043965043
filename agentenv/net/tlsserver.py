"""Server-side TLS over a connection whose first bytes were already read (the egress proxy
reads a ClientHello for its server name before it decides to answer it itself)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TypeVar

_CHUNK = 64 * 1024
T = TypeVar("T")


class TlsServerSession:
    """TLS as the server on `reader`/`writer`, the ClientHello in `first_bytes`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        context: ssl.SSLContext,
        first_bytes: bytes,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._incoming.write(first_bytes)

    async def handshake(self) -> None:
        await self._run(self._tls.do_handshake)

    async def read(self) -> bytes:
        """The next decrypted bytes; b"" once the client is done (closed, or cut off)."""
        try:
            return await self._run(lambda: self._tls.read(_CHUNK))
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return b""

    async def write(self, data: bytes) -> None:
        await self._run(lambda: self._tls.write(data))

    async def close(self) -> None:
        """Send close_notify (best effort), then close the connection."""
        try:
            self._tls.unwrap()
        except ssl.SSLError:
            pass  # the peer went first, or never finished the handshake
        try:
            await self._flush()
        except OSError:
            pass
        self._writer.close()

    async def _run(self, operation: Callable[[], T]) -> T:
        """Run a TLS operation, moving bytes to and from the connection until it completes."""
        while True:
            try:
                result = operation()
            except ssl.SSLWantReadError:
                await self._flush()
                data = await self._reader.read(_CHUNK)
                if data:
                    self._incoming.write(data)
                else:
                    self._incoming.write_eof()
                continue
            await self._flush()
            return result

    async def _flush(self) -> None:
        pending = self._outgoing.read()
        if pending:
            self._writer.write(pending)
            await self._writer.drain()
