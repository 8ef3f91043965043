"""The host name a guest's connection asks for, read from its first bytes: the `Host`
header of an HTTP request, or the server name (SNI) of a TLS ClientHello."""

from __future__ import annotations

import asyncio
import struct

# A request head or ClientHello larger than this is not read further (and not allowed).
MAX_HEAD = 16 * 1024
_TLS_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME_EXTENSION = 0x0000
_HOST_NAME = 0x00


async def read_http_head(reader: asyncio.StreamReader) -> bytes:
    """Bytes up to the end of the request head (or what came before EOF or the limit)."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < MAX_HEAD:
        chunk = await reader.read(MAX_HEAD - len(data))
        if not chunk:
            break
        data += chunk
    return data


def http_host(head: bytes) -> str | None:
    """The Host header's name (without its port), lower-cased; None when there is none."""
    lines = head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
    for line in lines:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"host":
            host = value.strip().decode("ascii", "replace")
            if host.startswith("["):
                return None  # an IPv6 literal names no domain
            return host.rsplit(":", 1)[0].lower().rstrip(".") or None
    return None


async def read_client_hello(reader: asyncio.StreamReader) -> bytes:
    """The first TLS record (a ClientHello fits one), or what came before EOF."""
    header = await reader.read(5)
    while len(header) < 5:
        more = await reader.read(5 - len(header))
        if not more:
            return header
        header += more
    length = min(struct.unpack("!H", header[3:5])[0], MAX_HEAD)
    body = b""
    while len(body) < length:
        chunk = await reader.read(length - len(body))
        if not chunk:
            break
        body += chunk
    return header + body


def tls_server_name(record: bytes) -> str | None:
    """The SNI host name of a ClientHello record, lower-cased; None when absent or malformed."""
    try:
        return _server_name(record)
    except (IndexError, struct.error, UnicodeDecodeError):
        return None


def _server_name(record: bytes) -> str | None:
    if record[0] != _TLS_HANDSHAKE or record[5] != _CLIENT_HELLO:
        return None
    hello = record[9:]  # after the record header (5) and the handshake header (4)
    at = 2 + 32  # client version, random
    at += 1 + hello[at]  # session id
    at += 2 + struct.unpack("!H", hello[at : at + 2])[0]  # cipher suites
    at += 1 + hello[at]  # compression methods
    end = at + 2 + struct.unpack("!H", hello[at : at + 2])[0]
    at += 2
    while at + 4 <= end:
        kind, size = struct.unpack("!HH", hello[at : at + 4])
        at += 4
        if kind == _SERVER_NAME_EXTENSION:
            names_end = at + 2 + struct.unpack("!H", hello[at : at + 2])[0]
            at += 2
            while at + 3 <= names_end:
                name_type, name_size = hello[at], struct.unpack("!H", hello[at + 1 : at + 3])[0]
                at += 3
                if name_type == _HOST_NAME:
                    return hello[at : at + name_size].decode("ascii").lower().rstrip(".") or None
                at += name_size
            return None
        at += size
    return None
