"""E2B's egressProxy on real namespaces: a guest's allowed TCP goes through a real SOCKS5
server (microsocks, behind stunnel for TLS), by address or, for an allowed domain, by name;
what the rules deny never reaches the proxy."""

from __future__ import annotations

import asyncio
import dataclasses
from contextlib import ExitStack
from ipaddress import IPv4Address
from pathlib import Path

from agentenv.net.egressproxy import EgressProxy
from agentenv.net.netns import apply_policy, ensure_host_forwarding
from agentenv.net.policy import TUNNEL_PORT, EgressPolicy
from agentenv.net.rules import egress_of
from agentenv.net.tunnels import EgressTunnels

from ..netlab import (
    SOCKS_PORT,
    SOCKS_TLS_PORT,
    Lab,
    peer,
    random_slash30,
    serving,
    sh,
    site_certificates,
    socks_server,
    tls_in_front,
)
from .standin import sandbox
from .test_guest_reach import fetch_as


async def test_allowed_tcp_goes_through_the_proxy(
    network: tuple[str, str], around: Lab, tmp_path: Path
) -> None:
    web = around.internet
    ca, certificate = site_certificates(tmp_path)
    with ExitStack() as stack:
        stack.enter_context(serving("web", netns=web.netns, port=80))
        dns = stack.enter_context(peer(random_slash30("192.168.205.0/24")))
        stack.enter_context(serving(web.ip, kind="dns", netns=dns.netns, address=dns.ip, port=53))
        socks = stack.enter_context(peer(random_slash30("198.51.100.0/24")))
        # The proxy reaches the web host and the resolver through the host, and back.
        for other in (web, dns):
            sh("ip", "-n", socks.netns, "route", "add", f"{other.ip}/32", "via", socks.host_ip)
            sh("ip", "-n", other.netns, "route", "add", f"{socks.ip}/32", "via", other.host_ip)
        log = tmp_path / "socks.log"
        stack.enter_context(socks_server(socks, dns.ip, log))
        stack.enter_context(tls_in_front(socks, certificate, tmp_path))
        policy = EgressPolicy(dns_server=IPv4Address(dns.ip))
        proxy = EgressProxy(lambda address: None, policy, network[1])
        ports = await proxy.start()
        proxy_config = {"address": f"{socks.ip}:{SOCKS_PORT}", "username": "agent"}
        network_option = {
            "allowOut": [f"{web.ip}/32", "*.site.test"],
            "denyOut": ["0.0.0.0/0"],
            "egressProxy": proxy_config | {"password": "s3cret"},
        }
        current = {"rules": egress_of(network_option, True)}
        tunnels = EgressTunnels(lambda sandbox_id: current["rules"], proxy)
        try:
            async with sandbox(network, 11, rules=current["rules"]) as (plan, guest):
                await ensure_host_forwarding(network[1], network[0], ports)

                async def use(option: dict[str, object]) -> None:
                    current["rules"] = egress_of(option, True)
                    await tunnels.open("tunnelled", plan.netns, plan.guest_gateway)
                    egress = dataclasses.replace(policy, proxy=ports)
                    await apply_policy(plan, current["rules"], egress)

                async def fetch(ip: str, host: str, port: int = 80) -> str:
                    return await asyncio.to_thread(fetch_as, guest, ip, port, host)

                await use(network_option)
                # By address, and by an allowed name the proxy resolves itself.
                assert await fetch(web.ip, "direct") == "web"
                assert await fetch("192.0.2.1", "api.site.test") == "web"
                text = log.read_text()
                assert f"connected to {web.ip}:80" in text
                assert "connected to api.site.test:80" in text
                # Denied: never asked of the proxy.
                assert await fetch("192.0.2.77", "other.test") == "closed"
                assert "192.0.2.77" not in log.read_text()
                # The wrong password: the proxy refuses, the guest gets nothing.
                wrong = network_option | {"egressProxy": proxy_config | {"password": "no"}}
                await use(wrong)
                assert await fetch(web.ip, "direct") == "closed"
                # Over TLS to the proxy, verified by the CA given for it.
                tls = {"enabled": True, "serverName": "socks.site.test", "caCert": ca.read_text()}
                over_tls = proxy_config | {
                    "address": f"{socks.ip}:{SOCKS_TLS_PORT}", "password": "s3cret", "tls": tls
                }  # fmt: skip
                await use(network_option | {"egressProxy": over_tls})
                assert await fetch(web.ip, "direct") == "web"
                # A proxy whose certificate its CA did not sign is never used.
                untrusted = over_tls | {"tls": tls | {"caCert": certificate.read_text()}}
                await use(network_option | {"egressProxy": untrusted})
                assert await fetch(web.ip, "direct") == "closed"
        finally:
            await tunnels.close_all()
            await proxy.close()
            await ensure_host_forwarding(network[1], network[0])


async def test_a_tunnel_listens_in_its_namespace_until_closed(network: tuple[str, str]) -> None:
    """Closed when its sandbox stops: an open listener would keep a deleted namespace."""
    proxy = EgressProxy(lambda address: None, EgressPolicy(), network[1])
    tunnels = EgressTunnels(lambda sandbox_id: None, proxy)

    def listening(netns: str) -> bool:
        sockets = sh("ip", "netns", "exec", netns, "ss", "-Hltn", f"sport = :{TUNNEL_PORT}")
        return bool(sockets.strip())

    async with sandbox(network, 12) as (plan, _):
        assert not listening(plan.netns)
        await tunnels.open("s12", plan.netns, plan.guest_gateway)
        await tunnels.open("s12", plan.netns, plan.guest_gateway)  # once is enough
        assert "s12" in tunnels and listening(plan.netns)
        tunnels.close("s12")
        assert "s12" not in tunnels and not listening(plan.netns)
