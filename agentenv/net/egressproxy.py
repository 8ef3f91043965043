"""The node's egress proxy: HTTP and TLS connections of sandboxes with domain rules or
header rules.

A sandbox whose `allowOut` names domains has its new TCP connections to ports 80 and 443
(those its allowed CIDRs do not cover) DNATed here by its namespace (`net/policy.py`); one
with header rules (`net/transforms.py`), those to port 443. The proxy reads the name the
connection asks for (HTTP `Host`, TLS SNI, `net/sniff.py`), and only when the sandbox may
reach it (an allowed domain, or an address its rules allow) connects on the guest's
behalf: to the addresses the name resolves to with the guests' own resolver, never to a
range the node's policy closes (so a lying SNI or a rebinding resolver gains nothing).
Anything else is closed, as E2B's firewall does.

A TLS connection to a name a header rule matches is answered by the proxy itself, with a
certificate of the node's CA (`net/authority.py`), which guests trust; its requests go on
over TLS to the real server, whose certificate is verified, with the rule's headers set
(`net/headerrelay.py`). Secrets in those headers are resolved here and never reach the
guest.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable
from ipaddress import IPv4Address, IPv4Network

import dns.asyncresolver
import dns.exception
import dns.resolver

from ..config import ConfigError
from .authority import EgressAuthority
from .headerrelay import relay_with_headers
from .policy import BLOCKED_RANGES, EgressPolicy, EgressPorts
from .rules import EgressRules
from .sniff import http_host, read_client_hello, read_http_head, tls_server_name
from .tlsserver import TlsServerSession
from .transforms import HeaderValues, LiteralValues

# Where the proxy finds a connection's sandbox: its id and rules, by namespace address.
SandboxAt = Callable[[str], tuple[str, EgressRules] | None]
# Opens the TCP stream a guest's connection goes on over: straight, or through a tunnel.
Dial = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

log = logging.getLogger(__name__)

# Reading the name, resolving it and connecting each get this long.
STEP_TIMEOUT = 10.0
# Connections one sandbox may have open through the proxy at once; more are closed.
MAX_PER_SANDBOX = 512
_CHUNK = 64 * 1024


class EgressProxy:
    """Serves sandboxes' HTTP and TLS connections by their domain rules."""

    def __init__(
        self,
        sandbox_at: SandboxAt,
        policy: EgressPolicy,
        host_subnet: str,
        *,
        authority: EgressAuthority | None = None,
        header_values: HeaderValues | None = None,
        upstream_tls: ssl.SSLContext | None = None,
        max_per_sandbox: int = MAX_PER_SANDBOX,
    ) -> None:
        """Without an `authority`, one of its own; without `header_values`, placeholders
        are unresolved; without `upstream_tls`, the host's trust store verifies servers."""
        # The running sandbox whose namespace address a connection comes from.
        self._sandbox_at = sandbox_at
        self._policy = policy
        self._authority = authority or EgressAuthority(secrets.token_bytes(32))
        self._header_values = header_values or LiteralValues()
        # Verifies the servers guests' intercepted requests go on to.
        self._upstream_tls = upstream_tls or upstream_context()
        # The guests' own resolver (the host's when none is configured); no cache, so a
        # name is looked up again for every connection.
        self._resolver = _resolver(policy)
        self._host_subnet = IPv4Network(host_subnet)
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task] = set()
        self._max_per_sandbox = max_per_sandbox
        # Connections open now, by the sandbox's namespace address.
        self._open: collections.Counter[str] = collections.Counter()

    async def start(self, host: str = "0.0.0.0") -> EgressPorts:
        ports = []
        for port, sniff in ((80, read_http_name), (443, read_tls_name)):
            server = await asyncio.start_server(
                functools.partial(self._serve, port=port, sniff=sniff), host, 0
            )
            self._servers.append(server)
            ports.append(server.sockets[0].getsockname()[1])
        return EgressPorts(*ports)

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        port: int,
        sniff: Callable[[asyncio.StreamReader], Awaitable[tuple[bytes, str | None]]],
    ) -> None:
        task = asyncio.current_task()
        assert task is not None  # each connection is served by a task of its own
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)
        upstream: asyncio.StreamWriter | None = None
        peer, counted = "", False
        try:
            peer = writer.get_extra_info("peername")[0]
            found = self._sandbox_at(peer)
            if found is None:
                return  # not a running sandbox's namespace
            sandbox_id, rules = found
            if self._open[peer] >= self._max_per_sandbox:
                log.warning("egress from %s refused: %d connections open", peer, self._open[peer])
                return
            self._open[peer] += 1
            counted = True
            head, name = await asyncio.wait_for(sniff(reader), STEP_TIMEOUT)
            addresses = [] if name is None else await self.resolve(name)
            reachable = [a for a in addresses if name is not None and rules.allows(name, a)]
            if name is None or not reachable:
                log.info("egress from %s to %r on port %d refused", peer, name, port)
                return
            transform = rules.transforms.headers_for(name) if port == 443 else None
            if transform is not None:
                dial = functools.partial(asyncio.open_connection, str(reachable[0]), port)
                await self.intercept(sandbox_id, name, head, (reader, writer), dial, transform)
                return
            connection = await asyncio.wait_for(
                asyncio.open_connection(str(reachable[0]), port), STEP_TIMEOUT
            )
            up_reader, upstream = connection
            upstream.write(head)
            await asyncio.gather(pipe(reader, upstream), pipe(up_reader, writer))
        except (OSError, TimeoutError, dns.exception.DNSException, ssl.SSLError) as exc:
            log.info("egress connection ended: %s", exc)
        finally:
            if counted:
                self._closed(peer)
            for stream in (writer, upstream):
                if stream is not None:
                    stream.close()

    async def intercept(
        self,
        sandbox_id: str,
        name: str,
        hello: bytes,
        guest: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        dial: Dial,
        transform: tuple[tuple[str, str], ...],
    ) -> None:
        """Answer the guest's TLS as `name`, and relay its requests over verified TLS to
        the real server (a TCP stream `dial` opens) with `transform`'s headers set."""

        async def upstream_tls() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            reader, writer = await dial()
            try:
                await writer.start_tls(self._upstream_tls, server_hostname=name)
            except BaseException:
                writer.close()
                raise
            return reader, writer

        # Both handshakes at once: the server's is not waited for after the guest's.
        upstream = asyncio.ensure_future(asyncio.wait_for(upstream_tls(), STEP_TIMEOUT))
        session = TlsServerSession(*guest, self._authority.server_context(name), hello)
        try:
            await asyncio.wait_for(session.handshake(), STEP_TIMEOUT)
            up_reader, up_writer = await upstream
        except BaseException:
            upstream.cancel()
            done = await asyncio.gather(upstream, return_exceptions=True)
            if isinstance(done[0], tuple):
                done[0][1].close()
            await session.close()
            raise

        async def headers() -> list[tuple[str, str]]:
            return [
                (header, await self._header_values.resolve(sandbox_id, value))
                for header, value in transform
            ]

        try:
            await relay_with_headers(session, (up_reader, up_writer), headers)
        finally:
            up_writer.close()
            await session.close()

    def _closed(self, peer: str) -> None:
        self._open[peer] -= 1
        if not self._open[peer]:
            del self._open[peer]

    async def resolve(self, name: str) -> list[IPv4Address]:
        """`name`'s IPv4 addresses, from the guests' resolver, that guests may reach."""
        with contextlib.suppress(dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
            answer = await self._resolver.resolve(name, "A")
            return [IPv4Address(a.address) for a in answer if self.reachable(a.address)]
        return []

    def reachable(self, address: str) -> bool:
        ip = IPv4Address(address)
        if ip in self._host_subnet:
            return False
        if any(ip in allowed for allowed in self._policy.allowed_ranges):
            return True
        return not any(ip in blocked for blocked in BLOCKED_RANGES)


def upstream_context(trusted_cas: str = "") -> ssl.SSLContext:
    """Verifies the servers reached for intercepted requests: by the host's trust store,
    and the PEM file `trusted_cas` names, if any."""
    context = ssl.create_default_context()
    context.set_alpn_protocols(["http/1.1"])
    if trusted_cas:
        try:
            context.load_verify_locations(trusted_cas)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"net.egress_trusted_cas: {trusted_cas}: {exc}") from exc
    return context


def _resolver(policy: EgressPolicy) -> dns.asyncresolver.Resolver:
    """A resolver asking `policy`'s DNS server, else the host's; with neither, one that
    answers nothing (so every name is refused, as guests get no DNS either)."""
    try:
        resolver = dns.asyncresolver.Resolver(configure=policy.dns_server is None)
    except dns.resolver.NoResolverConfiguration:
        resolver = dns.asyncresolver.Resolver(configure=False)
    if policy.dns_server is not None:
        resolver.nameservers = [str(policy.dns_server)]
    resolver.lifetime = STEP_TIMEOUT
    return resolver


async def read_http_name(reader: asyncio.StreamReader) -> tuple[bytes, str | None]:
    """The request head read, and the name its Host header asks for."""
    head = await read_http_head(reader)
    return head, http_host(head)


async def read_tls_name(reader: asyncio.StreamReader) -> tuple[bytes, str | None]:
    """The ClientHello read, and the name it asks for (SNI)."""
    hello = await read_client_hello(reader)
    return hello, tls_server_name(hello)


async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close `sink` so the other direction can finish."""
    while chunk := await source.read(_CHUNK):
        sink.write(chunk)
        await sink.drain()
    if sink.can_write_eof():
        sink.write_eof()
