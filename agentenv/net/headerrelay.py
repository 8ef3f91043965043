"""HTTP/1.1 between a guest and an upstream server, with a rule's headers set on every
request (E2B's `network.rules` transforms); h11 keeps each side's framing right.

Requests go one at a time (a guest that pipelines waits for each answer), each with the
rule's headers, their placeholders resolved just before it is sent. A protocol upgrade
(WebSocket) is relayed as bytes once the server switched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import h11

from .tlsserver import TlsServerSession
from .transforms import UnresolvedPlaceholder

_CHUNK = 64 * 1024
# Builds the headers a request gets; raises UnresolvedPlaceholder for an unknown reference.
HeaderSource = Callable[[], Awaitable[list[tuple[str, str]]]]


class _Ended(Exception):
    """One side closed, or broke the protocol: the relay stops."""


async def relay_with_headers(
    guest: TlsServerSession,
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    headers: HeaderSource,
) -> None:
    """Relay requests and answers until either side is done."""
    up_reader, up_writer = upstream
    down = h11.Connection(h11.SERVER)
    up = h11.Connection(h11.CLIENT)

    async def to_guest(event: h11.Event) -> None:
        data = down.send(event)
        if data:
            await guest.write(data)

    async def to_upstream(event: h11.Event) -> None:
        data = up.send(event)
        if data:
            up_writer.write(data)
            await up_writer.drain()

    try:
        while True:
            request = await _next(down, guest.read)
            if not isinstance(request, h11.Request):
                return
            try:
                extra = await headers()
            except UnresolvedPlaceholder as exc:
                await _refuse(to_guest, 502, f"aenv egress: {exc}")
                return
            await to_upstream(_with_headers(request, extra))
            while True:
                if down.they_are_waiting_for_100_continue:
                    await to_guest(h11.InformationalResponse(status_code=100, headers=[]))
                event = await _next(down, guest.read)
                if isinstance(event, h11.Request | h11.ConnectionClosed):
                    raise _Ended
                await to_upstream(event)
                if isinstance(event, h11.EndOfMessage):
                    break
            while True:
                event = await _next(up, lambda: up_reader.read(_CHUNK))
                if isinstance(event, h11.ConnectionClosed):
                    raise _Ended
                if isinstance(event, h11.InformationalResponse) and event.status_code == 100:
                    continue  # the guest had its own 100 from us
                await to_guest(event)
                if isinstance(event, h11.EndOfMessage):
                    break
                if isinstance(event, h11.InformationalResponse) and event.status_code == 101:
                    await _switched(guest, down, up, upstream)
                    return
            if down.our_state is h11.MUST_CLOSE or up.their_state is h11.MUST_CLOSE:
                return
            down.start_next_cycle()
            up.start_next_cycle()
    except (_Ended, h11.ProtocolError, ConnectionError):
        return


def _with_headers(request: h11.Request, extra: list[tuple[str, str]]) -> h11.Request:
    """`request` with `extra` set: a header of the same name (any case) is replaced."""
    replaced = {name.lower().encode() for name, _ in extra}
    kept = [(n, v) for n, v in request.headers.raw_items() if n.lower() not in replaced]
    return h11.Request(
        method=request.method,
        target=request.target,
        headers=kept + [(n.encode(), v.encode()) for n, v in extra],
        http_version=request.http_version,
    )


async def _next(connection: h11.Connection, read: Callable[[], Awaitable[bytes]]) -> h11.Event:
    while True:
        event = connection.next_event()
        if event is h11.PAUSED:
            raise _Ended  # a pipelined request while the answer is pending
        if isinstance(event, h11.Event):
            return event
        connection.receive_data(await read())


async def _refuse(send: Callable[[h11.Event], Awaitable[None]], status: int, text: str) -> None:
    body = text.encode()
    headers = [("content-type", "text/plain"), ("content-length", str(len(body)))]
    headers.append(("connection", "close"))
    await send(h11.Response(status_code=status, headers=headers))
    await send(h11.Data(data=body))
    await send(h11.EndOfMessage())


async def _switched(
    guest: TlsServerSession,
    down: h11.Connection,
    up: h11.Connection,
    upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """After a 101: bytes both ways, starting with what each side sent past the switch."""
    up_reader, up_writer = upstream
    guest_extra, _ = down.trailing_data
    upstream_extra, _ = up.trailing_data
    if guest_extra:
        up_writer.write(guest_extra)
    if upstream_extra:
        await guest.write(upstream_extra)

    async def guest_to_upstream() -> None:
        while data := await guest.read():
            up_writer.write(data)
            await up_writer.drain()
        if up_writer.can_write_eof():
            up_writer.write_eof()

    async def upstream_to_guest() -> None:
        while data := await up_reader.read(_CHUNK):
            await guest.write(data)

    await asyncio.gather(guest_to_upstream(), upstream_to_guest())
