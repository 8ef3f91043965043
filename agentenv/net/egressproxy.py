"""The node's egress proxy: HTTP and TLS connections of sandboxes with domain rules.

A sandbox whose `allowOut` names domains has its new TCP connections to ports 80 and 443
(those its allowed CIDRs do not cover) DNATed here by its namespace (`net/policy.py`).
The proxy reads the name the connection asks for (HTTP `Host`, TLS SNI, `net/sniff.py`),
and only when it matches an allowed domain connects on the guest's behalf: to the
addresses the name resolves to with the guests' own resolver, never to a range the node's
policy closes (so a lying SNI or a rebinding resolver gains nothing). Anything else is
closed, as E2B's firewall does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from ipaddress import IPv4Address, IPv4Network

import dns.asyncresolver
import dns.exception
import dns.resolver

from .policy import BLOCKED_RANGES, EgressPolicy, EgressPorts
from .rules import EgressRules
from .sniff import http_host, read_client_hello, read_http_head, tls_server_name

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
        rules_at: Callable[[str], EgressRules | None],
        policy: EgressPolicy,
        host_subnet: str,
        max_per_sandbox: int = MAX_PER_SANDBOX,
    ) -> None:
        # The rules of the running sandbox whose namespace address a connection comes from.
        self._rules_at = rules_at
        self._policy = policy
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
        for port, sniff in ((80, self._http_name), (443, self._tls_name)):
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
            rules = self._rules_at(peer)
            if rules is None:
                return  # not a running sandbox's namespace
            if self._open[peer] >= self._max_per_sandbox:
                log.warning("egress from %s refused: %d connections open", peer, self._open[peer])
                return
            self._open[peer] += 1
            counted = True
            head, name = await asyncio.wait_for(sniff(reader), STEP_TIMEOUT)
            if name is None or not rules.allows_host(name):
                log.info("egress from %s to %r on port %d refused", peer, name, port)
                return
            addresses = await self._resolve(name)
            if not addresses:
                log.info("egress to %s refused: it resolves to no address guests may reach", name)
                return
            connection = await asyncio.wait_for(
                asyncio.open_connection(str(addresses[0]), port), STEP_TIMEOUT
            )
            up_reader, upstream = connection
            upstream.write(head)
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (OSError, TimeoutError, dns.exception.DNSException) as exc:
            log.info("egress connection ended: %s", exc)
        finally:
            if counted:
                self._closed(peer)
            for stream in (writer, upstream):
                if stream is not None:
                    stream.close()

    def _closed(self, peer: str) -> None:
        self._open[peer] -= 1
        if not self._open[peer]:
            del self._open[peer]

    async def _http_name(self, reader: asyncio.StreamReader) -> tuple[bytes, str | None]:
        head = await read_http_head(reader)
        return head, http_host(head)

    async def _tls_name(self, reader: asyncio.StreamReader) -> tuple[bytes, str | None]:
        hello = await read_client_hello(reader)
        return hello, tls_server_name(hello)

    async def _resolve(self, name: str) -> list[IPv4Address]:
        """`name`'s IPv4 addresses, from the guests' resolver, that guests may reach."""
        with contextlib.suppress(dns.resolver.NoAnswer, dns.resolver.NXDOMAIN):
            answer = await self._resolver.resolve(name, "A")
            return [IPv4Address(a.address) for a in answer if self._reachable(a.address)]
        return []

    def _reachable(self, address: str) -> bool:
        ip = IPv4Address(address)
        if ip in self._host_subnet:
            return False
        if any(ip in allowed for allowed in self._policy.allowed_ranges):
            return True
        return not any(ip in blocked for blocked in BLOCKED_RANGES)


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


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until EOF, then half-close `sink` so the other direction can finish."""
    while chunk := await source.read(_CHUNK):
        sink.write(chunk)
        await sink.drain()
    if sink.can_write_eof():
        sink.write_eof()
