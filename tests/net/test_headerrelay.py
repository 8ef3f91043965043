"""The header relay's request parsing against a fake guest and a loopback server: every
request rewritten, bodies counted out whatever their framing, ambiguous heads refused."""

from __future__ import annotations

import asyncio

import pytest

from agentenv.net.headerrelay import BadRequest, parse_head, relay_with_headers
from agentenv.net.transforms import UnresolvedPlaceholder


class FakeGuest:
    """What a guest's TLS session gives the relay: its bytes in pieces, and what it got."""

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = list(pieces)
        self.received = b""

    async def read(self) -> bytes:
        await asyncio.sleep(0)
        return self._pieces.pop(0) if self._pieces else b""

    async def write(self, data: bytes) -> None:
        self.received += data


async def _relay(
    pieces: list[bytes], headers: list[tuple[str, str]] | None = None
) -> tuple[bytes, bytes]:
    """What the server got, and what the guest got (the server answers "ok" at its end)."""
    got = bytearray()

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            got.extend(data)
        writer.write(b"ok")
        writer.close()

    listening = await asyncio.start_server(server, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    guest = FakeGuest(pieces)

    async def extra() -> list[tuple[str, str]]:
        if headers is None:
            raise UnresolvedPlaceholder("${e2b.secrets.gone} is not a secret")
        return headers

    try:
        upstream = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.wait_for(relay_with_headers(guest, upstream, extra), 10)  # type: ignore[arg-type]
    finally:
        listening.close()
    return bytes(got), guest.received


RULE = [("Authorization", "Bearer rule")]


async def test_each_request_is_rewritten_whatever_its_framing() -> None:
    pieces = [
        b"POST /a HTTP/1.1\r\nHost: h\r\nauthorization: mine\r\nContent-Length: 5\r\n\r\nhel",
        b"lo",
        b"POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n",
        b"0\r\nTrailer: t\r\n\r\nGET /c HTTP/1.1\r\nHost: h\r\n\r\n",
    ]
    sent, answered = await _relay(pieces, RULE)
    assert sent == (
        b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nAuthorization: Bearer rule\r\n\r\n"
        b"hello"
        b"POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
        b"Authorization: Bearer rule\r\n\r\n3;x=y\r\nabc\r\n0\r\nTrailer: t\r\n\r\n"
        b"GET /c HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer rule\r\n\r\n"
    )
    assert answered == b"ok"


async def test_a_body_that_looks_like_a_request_is_not_one() -> None:
    smuggled = b"GET /admin HTTP/1.1\r\nHost: h\r\n\r\n"
    head = f"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: {len(smuggled)}\r\n\r\n".encode()
    sent, _ = await _relay([head + smuggled], RULE)
    assert sent.count(b"Authorization: Bearer rule") == 1 and sent.endswith(smuggled)


async def test_an_upgrade_goes_raw_after_its_request() -> None:
    head = b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    frames = b"GET /not-a-request HTTP/1.1\r\n\r\n\x81\x05hello"
    sent, _ = await _relay([head + frames], RULE)
    assert sent.count(b"Authorization") == 1 and sent.endswith(frames)


async def test_an_unresolved_placeholder_answers_the_first_request_itself() -> None:
    sent, answered = await _relay([b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"], None)
    assert sent == b""
    assert answered.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert answered.endswith(b"aenv egress: ${e2b.secrets.gone} is not a secret")


@pytest.mark.parametrize(
    ("head", "text"),
    [
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", "both"),
        (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", "one number"),
        (b"POST / HTTP/1.1\r\nContent-Length: -3\r\n\r\n", "one number"),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "chunked last"),
        (b"GET / HTTP/1.1\r\nHost: h\r\n folded\r\n\r\n", "name: value"),
        (b"GET / HTTP/2\r\n\r\n", "request line"),
    ],
)
async def test_heads_read_two_ways_are_refused(head: bytes, text: str) -> None:
    with pytest.raises(BadRequest, match=text):
        parse_head(head)
    sent, answered = await _relay([head], RULE)
    assert sent == b"" and answered.startswith(b"HTTP/1.1 400 Bad Request\r\n")


async def test_the_same_length_twice_is_one_length() -> None:
    assert (
        parse_head(b"POST / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n").length == 3
    )
