"""E2B's `network.egressProxy`: every allowed outbound TCP connection of a sandbox goes
through the user's SOCKS5 server; the guest does not know.

The sandbox's namespace sends its guest's new TCP connections to a listener of the node's
inside that namespace (`net/nslistener.py`), where the destination each one asked for is
known. Each is checked as without a proxy (the sandbox's rules, then the node's policy)
before the proxy is asked to connect: to the address, or, for HTTP and TLS to an allowed
domain, to the name, which the proxy resolves (SOCKS5's remote DNS). Header rules apply
before the connection is dialled (`net/egressproxy.py` intercepts, over the tunnel).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from ipaddress import IPv4Address

import dns.exception

from .dns import is_dns_name
from .egressproxy import STEP_TIMEOUT, EgressProxy, pipe, read_http_name, read_tls_name
from .nslistener import listen_in, original_destination
from .policy import TUNNEL_PORT
from .rules import EgressRules
from .socks import SocksError, SocksUpstream, socks_connect

log = logging.getLogger(__name__)


class EgressTunnels:
    """The listeners of this node's sandboxes that tunnel their egress, by sandbox id."""

    def __init__(self, rules_of: Callable[[str], EgressRules | None], proxy: EgressProxy) -> None:
        # A running sandbox's rules (None: it does not run here).
        self._rules_of = rules_of
        # Resolves names and checks addresses as the node's egress proxy does; intercepts.
        self._proxy = proxy
        self._servers: dict[str, asyncio.Server] = {}

    def __contains__(self, sandbox_id: str) -> bool:
        return sandbox_id in self._servers

    async def open(self, sandbox_id: str, netns: str, gateway: str) -> None:
        """The sandbox's listener, if it has none yet."""
        if sandbox_id in self._servers:
            return
        sock = await asyncio.to_thread(listen_in, netns, gateway, TUNNEL_PORT)
        serve = functools.partial(self._serve, sandbox_id)
        self._servers[sandbox_id] = await asyncio.start_server(serve, sock=sock)

    def close(self, sandbox_id: str) -> None:
        """Its listener goes (a listener would keep a deleted namespace alive)."""
        server = self._servers.pop(sandbox_id, None)
        if server is not None:
            server.close()

    async def close_all(self) -> None:
        servers = list(self._servers.values())
        self._servers.clear()
        for server in servers:
            server.close()
        for server in servers:
            await server.wait_closed()

    async def _serve(
        self, sandbox_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            rules = self._rules_of(sandbox_id)
            if rules is None or rules.upstream is None:
                return
            address, port = original_destination(writer.get_extra_info("socket"))
            head, name = b"", None
            if (rules.domains or rules.transforms) and port in (80, 443):
                sniff = read_tls_name if port == 443 else read_http_name
                head, name = await asyncio.wait_for(sniff(reader), STEP_TIMEOUT)
            target: str | IPv4Address
            if name is not None and rules.allows_host(name):
                target = name  # the proxy resolves it
            elif rules.allows(name or "", address) and self._proxy.reachable(str(address)):
                target = address
            else:
                log.info("tunnel of %s to %s:%d (%r) refused", sandbox_id, address, port, name)
                return
            dial = functools.partial(self._dial, rules.upstream, target, port)
            transform = rules.transforms.headers_for(name) if name and port == 443 else None
            if name is not None and transform is not None:
                await self._proxy.intercept(
                    sandbox_id, name, head, (reader, writer), dial, transform
                )
                return
            up_reader, upstream = await dial()
            upstream.write(head)
            await asyncio.gather(pipe(reader, upstream), pipe(up_reader, writer))
        except (OSError, TimeoutError, dns.exception.DNSException) as exc:
            log.info("tunnel of %s ended: %s", sandbox_id, exc)
        finally:
            for stream in (writer, upstream):
                if stream is not None:
                    stream.close()

    async def _dial(
        self, upstream: SocksUpstream, target: str | IPv4Address, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A stream to `target`:`port` through the sandbox's proxy, itself a host guests
        may reach."""
        if is_dns_name(upstream.host.lower()):
            resolved = await self._proxy.resolve(upstream.host)
            if not resolved:
                raise SocksError(f"egress proxy {upstream.host}: no address guests may reach")
            proxy_address = resolved[0]
        else:
            proxy_address = IPv4Address(upstream.host)
        if not self._proxy.reachable(str(proxy_address)):
            raise SocksError(f"egress proxy {upstream.host}: a range guests may not reach")
        return await socks_connect(upstream, proxy_address, target, port, STEP_TIMEOUT)
