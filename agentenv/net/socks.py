"""A SOCKS5 client (RFC 1928, with RFC 1929's username and password) for E2B's
`network.egressProxy`: a sandbox's outbound TCP tunnelled through the user's proxy,
optionally over TLS to it."""

from __future__ import annotations

import asyncio
import ssl
import struct
from dataclasses import dataclass
from ipaddress import IPv4Address
from typing import Any

_VERSION = 5
_NO_AUTH, _PASSWORD, _REFUSED = 0, 2, 0xFF
_CONNECT = 1
_IPV4, _DOMAIN, _IPV6 = 1, 3, 4
# RFC 1928's reply codes, as a client reports them.
_REPLIES = {
    1: "general failure",
    2: "connection not allowed by ruleset",
    3: "network unreachable",
    4: "host unreachable",
    5: "connection refused",
    6: "TTL expired",
    7: "command not supported",
    8: "address type not supported",
}


class SocksError(OSError):
    """The SOCKS5 server refused, or spoke something else."""


@dataclass(frozen=True)
class SocksUpstream:
    """Where a sandbox's TCP is tunnelled, as its `egressProxy` says (checked on the way in)."""

    host: str
    port: int
    username: str | None = None
    password: str | None = None
    tls: bool = False
    # The name the proxy's certificate must carry (and its SNI); None: `host`.
    server_name: str | None = None
    # PEM certificates verifying the proxy instead of the host's store.
    ca_cert: str | None = None

    @classmethod
    def of(cls, config: dict[str, Any]) -> SocksUpstream:
        host, _, port = str(config["address"]).rpartition(":")
        tls = config.get("tls") or {}
        return cls(
            host,
            int(port),
            config.get("username"),
            config.get("password"),
            bool(tls.get("enabled")),
            tls.get("serverName"),
            tls.get("caCert"),
        )

    def tls_context(self) -> ssl.SSLContext | None:
        """TLS to the proxy: its `ca_cert` alone, else the host's store, verifies it."""
        return ssl.create_default_context(cadata=self.ca_cert) if self.tls else None


async def socks_connect(
    upstream: SocksUpstream,
    proxy_address: IPv4Address,
    destination: str | IPv4Address,
    port: int,
    timeout: float,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to `destination`:`port` through the proxy at `proxy_address`; a name is
    sent as one (the proxy resolves it)."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            str(proxy_address),
            upstream.port,
            ssl=upstream.tls_context(),
            server_hostname=(upstream.server_name or upstream.host) if upstream.tls else None,
        ),
        timeout,
    )
    try:
        await asyncio.wait_for(_negotiate(upstream, reader, writer, destination, port), timeout)
    except BaseException:
        writer.close()
        raise
    return reader, writer


async def _negotiate(
    upstream: SocksUpstream,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    destination: str | IPv4Address,
    port: int,
) -> None:
    methods = [_PASSWORD] if upstream.username is not None else [_NO_AUTH]
    writer.write(bytes([_VERSION, len(methods), *methods]))
    version, method = await _read(reader, 2)
    if version != _VERSION:
        raise SocksError("the egress proxy does not speak SOCKS5")
    if method == _REFUSED or method not in methods:
        raise SocksError("the egress proxy accepts none of the offered authentications")
    if method == _PASSWORD:
        user = (upstream.username or "").encode()
        password = (upstream.password or "").encode()
        writer.write(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
        _, status = await _read(reader, 2)
        if status != 0:
            raise SocksError("the egress proxy refused its username and password")
    if isinstance(destination, IPv4Address):
        address = bytes([_IPV4]) + destination.packed
    else:
        name = destination.encode("idna")
        address = bytes([_DOMAIN, len(name)]) + name
    writer.write(bytes([_VERSION, _CONNECT, 0]) + address + struct.pack(">H", port))
    await writer.drain()
    _, reply, _, kind = await _read(reader, 4)
    if reply != 0:
        raise SocksError(f"the egress proxy: {_REPLIES.get(reply, f'reply {reply}')}")
    bound = {_IPV4: 4, _IPV6: 16}.get(kind)
    if bound is None:
        (bound,) = await _read(reader, 1)
    await _read(reader, bound + 2)


async def _read(reader: asyncio.StreamReader, size: int) -> bytes:
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise SocksError("the egress proxy closed the connection") from None
