"""HTTP/1.1 between a guest and an upstream server, with a rule's headers set on every
request (E2B's `network.rules` transforms).

Only the guest's side is parsed: each request head is read, checked and rewritten, and its
body is counted out (by `Content-Length`, or chunk by chunk) so the next head is found.
Answers go back as they come, unparsed: that keeps a kept-alive request nearly as cheap as
one passed through whole, pipelining works, and so does `Expect: 100-continue`. h11 would
parse both sides and hold each request until the previous answer is read, so this small
parser is ours. A request that asks to upgrade (WebSocket) ends the parsing: what follows
is relayed as bytes both ways.

A head that could be read two ways (both `Content-Length` and `Transfer-Encoding`, two
lengths, a folded line) is refused, so the server never frames a request otherwise than
the proxy did.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .sniff import MAX_HEAD
from .tlsserver import TlsServerSession
from .transforms import UnresolvedPlaceholder

_CHUNK = 64 * 1024
# Builds the headers a request gets; raises UnresolvedPlaceholder for an unknown reference.
HeaderSource = Callable[[], Awaitable[list[tuple[str, str]]]]
_TOKEN = re.compile(rb"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_REQUEST_LINE = re.compile(rb"^[A-Z]+ [^ ]+ HTTP/1\.[01]$")


class BadRequest(Exception):
    """The guest's request cannot be read one way only; answered 400, then closed."""


@dataclass(frozen=True)
class RequestHead:
    request_line: bytes
    headers: list[tuple[bytes, bytes]]
    # None: no body; -1: chunked.
    length: int | None
    upgrade: bool

    def rewritten(self, extra: list[tuple[str, str]]) -> bytes:
        """The head with `extra` set: a header of the same name (any case) is replaced."""
        replaced = {name.lower().encode() for name, _ in extra}
        lines = [self.request_line]
        lines += [n + b": " + v for n, v in self.headers if n.lower() not in replaced]
        lines += [n.encode() + b": " + v.encode() for n, v in extra]
        return b"\r\n".join(lines) + b"\r\n\r\n"


def parse_head(head: bytes) -> RequestHead:
    """A request head (up to its blank line); BadRequest when it is not plainly one."""
    request_line, *lines = head[:-4].split(b"\r\n")
    if not _REQUEST_LINE.match(request_line):
        raise BadRequest("not an HTTP/1.x request line")
    headers = []
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not _TOKEN.match(name):
            raise BadRequest("a header line that is not `name: value`")
        headers.append((name, value.strip(b" \t")))
    named: dict[bytes, list[bytes]] = {}
    for name, value in headers:
        named.setdefault(name.lower(), []).append(value)
    lengths = set(named.get(b"content-length", []))
    codings = b",".join(named.get(b"transfer-encoding", [])).lower()
    if lengths and codings:
        raise BadRequest("both Content-Length and Transfer-Encoding")
    length: int | None = None
    if codings:
        if [c.strip() for c in codings.split(b",")][-1] != b"chunked":
            raise BadRequest("a transfer coding other than chunked last")
        length = -1
    elif lengths:
        if len(lengths) > 1 or not next(iter(lengths)).isdigit():
            raise BadRequest("a Content-Length that is not one number")
        length = int(next(iter(lengths)))
    upgrade = b"upgrade" in named and any(
        b"upgrade" in v.lower() for v in named.get(b"connection", [])
    )
    return RequestHead(request_line, headers, length, upgrade)


class _GuestStream:
    """The guest's decrypted bytes, with what was read past the current piece kept."""

    def __init__(self, guest: TlsServerSession) -> None:
        self._guest = guest
        self.buffer = bytearray()

    async def fill(self) -> bool:
        data = await self._guest.read()
        self.buffer += data
        return bool(data)

    async def head(self) -> bytes | None:
        """The next request head; None at a clean end between requests."""
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > MAX_HEAD:
                raise BadRequest("a request head over 16 KiB")
            if not await self.fill():
                if self.buffer:
                    raise BadRequest("the connection ended inside a request head")
                return None
        head = bytes(self.buffer[: end + 4])
        del self.buffer[: end + 4]
        return head

    async def take(self, size: int) -> bytes:
        """Up to `size` bytes, at least one; b"" at the end."""
        if not self.buffer and not await self.fill():
            return b""
        piece = bytes(self.buffer[:size])
        del self.buffer[:size]
        return piece

    async def line(self) -> bytes:
        """The next CRLF-terminated line, with its CRLF."""
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > MAX_HEAD or not await self.fill():
                raise BadRequest("a chunk line too long, or cut off")
        line = bytes(self.buffer[: end + 2])
        del self.buffer[: end + 2]
        return line


async def relay_with_headers(
    guest: TlsServerSession,
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    headers: HeaderSource,
) -> None:
    """Relay requests (rewritten) and answers (as they come) until either side is done."""
    up_reader, up_writer = upstream

    async def answers() -> None:
        while data := await up_reader.read(_CHUNK):
            await guest.write(data)

    answering = asyncio.ensure_future(answers())
    requesting = asyncio.ensure_future(_requests(_GuestStream(guest), up_writer, headers))
    try:
        done, _ = await asyncio.wait([answering, requesting], return_when=asyncio.FIRST_COMPLETED)
        if requesting in done:
            failure = requesting.exception()
            if failure is None:
                await answering  # the guest is done asking; the answers may still come
            elif isinstance(failure, Refusal) and failure.first:
                # Nothing of the server's is on its way to the guest: the answer is ours.
                answering.cancel()
                await asyncio.gather(answering, return_exceptions=True)
                await guest.write(_answer(failure.status, failure.text))
    finally:
        for task in (answering, requesting):
            task.cancel()
        await asyncio.gather(answering, requesting, return_exceptions=True)


class Refusal(Exception):
    """A request the proxy answers itself, then closes: `first`, it was the first one."""

    def __init__(self, status: int, text: str, first: bool) -> None:
        super().__init__(text)
        self.status, self.text, self.first = status, text, first


async def _requests(
    stream: _GuestStream, up_writer: asyncio.StreamWriter, headers: HeaderSource
) -> None:
    """The guest's requests to the server, each head rewritten; its body counted out."""
    sent = 0
    while True:
        try:
            raw = await stream.head()
            if raw is None:
                break
            head = parse_head(raw)
            extra = await headers()
        except BadRequest as exc:
            raise Refusal(400, f"aenv egress: {exc}", sent == 0) from exc
        except UnresolvedPlaceholder as exc:
            raise Refusal(502, f"aenv egress: {exc}", sent == 0) from exc
        up_writer.write(head.rewritten(extra))
        sent += 1
        if head.length == -1:
            await _chunked(stream, up_writer)
        elif head.length:
            left = head.length
            while left:
                piece = await stream.take(min(left, _CHUNK))
                if not piece:
                    return
                up_writer.write(piece)
                await up_writer.drain()
                left -= len(piece)
        await up_writer.drain()
        if head.upgrade:
            # Whether the server switched is in its answer, which is not read: what
            # follows is relayed as it is.
            while data := await stream.take(_CHUNK):
                up_writer.write(data)
                await up_writer.drain()
            break
    if up_writer.can_write_eof():
        up_writer.write_eof()


async def _chunked(stream: _GuestStream, up_writer: asyncio.StreamWriter) -> None:
    """A chunked body, chunks and trailers, as it comes."""
    while True:
        line = await stream.line()
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise BadRequest("a chunk size that is not hexadecimal") from None
        up_writer.write(line)
        if size == 0:
            while (trailer := await stream.line()) != b"\r\n":
                up_writer.write(trailer)
            up_writer.write(b"\r\n")
            return
        left = size + 2  # the chunk and its CRLF
        while left:
            piece = await stream.take(min(left, _CHUNK))
            if not piece:
                raise BadRequest("the connection ended inside a chunk")
            up_writer.write(piece)
            await up_writer.drain()
            left -= len(piece)


def _answer(status: int, text: str) -> bytes:
    body = text.encode()
    reason = {400: "Bad Request", 502: "Bad Gateway"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body
