"""What a guest reaches, on real namespaces and rules, with a namespace standing in for the VM."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from contextlib import ExitStack
from ipaddress import IPv4Address, IPv4Network

import pytest

from agentenv.net.egressproxy import EgressProxy
from agentenv.net.netns import (
    apply_policy,
    ensure_host_forwarding,
)
from agentenv.net.policy import EgressPolicy
from agentenv.net.rules import EgressRules, parse_egress

from ..netlab import (
    RESOLVED_IP,
    Lab,
    host_addresses,
    peer,
    probe_command,
    random_slash30,
    reached,
    serving,
    sh,
)
from .standin import plan_for, sandbox


def probe(targets: list[str], netns: str = "") -> dict[str, str]:
    """PROBE's outcomes from `netns`, or from the host itself."""
    command = probe_command(sys.executable, targets)
    return json.loads(sh(*(["ip", "netns", "exec", netns] if netns else []), *command))


def fetch(target: str) -> str:
    """One PROBE target's outcome from the host."""
    return probe([target])[target]


def test_lab_servers_answer_the_host(network: tuple[str, str], around: Lab) -> None:
    """What guests must not reach is up: the host reaches each of it."""
    for name in ("host", "internet", "private", "resolver"):
        assert fetch(around.url(name)) == name
    assert fetch(f"dns://{around.resolver.ip}/example.test") == RESOLVED_IP
    # Metadata is routed into the lab for the sandboxes' subnet only, never for the host.
    source = plan_for(network, 1).ns_ip
    route = sh("ip", "route", "get", "169.254.169.254", "from", source, "iif", "lo")
    assert around.private.host_veth in route


async def test_guest_reaches_the_internet_and_nothing_else(
    network: tuple[str, str], around: Lab
) -> None:
    async with sandbox(network, 1) as (plan, guest), sandbox(network, 2) as (other, other_guest):
        with ExitStack() as stack:
            other_port = stack.enter_context(serving("other-guest", netns=other_guest))
            namespace_port = stack.enter_context(serving("namespace", netns=plan.netns))
            # The host reaches a guest on any port, through its namespace address.
            assert fetch(f"http://{other.ns_ip}:{other_port}/") == "other-guest"
            closed = [
                # Its own and the other sandbox's host-side addresses are among the host's.
                *(around.url("host", address) for address in host_addresses()),
                f"http://{other.ns_ip}:{other_port}/",
                f"http://{other.ns_ip}:49983/",
                f"http://{plan.guest_gateway}:{namespace_port}/",
                f"http://{plan.ns_ip}:{namespace_port}/",
                around.url("private"),
                around.url("metadata"),
                f"dns://{plan.guest_gateway}/example.test",
            ]
            internet = around.url("internet")
            assert reached(probe([internet, *closed], guest)) == {internet: "internet"}


async def test_no_internet_means_no_new_connection(network: tuple[str, str], around: Lab) -> None:
    async with sandbox(network, 3, rules=EgressRules(internet=False)) as (plan, guest):
        with serving("guest", netns=guest) as port:
            assert fetch(f"http://{plan.ns_ip}:{port}/") == "guest"
        targets = [around.url("internet"), f"dns://{plan.guest_gateway}/example.test"]
        assert reached(probe(targets, guest)) == {}


async def test_allowed_ranges_and_dns(network: tuple[str, str], around: Lab) -> None:
    """An allowed range opens a private service, never the host's address inside it; DNS
    through the gateway reaches the resolver, which is otherwise closed."""
    private_net = IPv4Network(f"{around.private.ip}/30", strict=False)
    egress = EgressPolicy((private_net,), IPv4Address(around.resolver.ip))
    async with sandbox(network, 4, egress=egress) as (plan, guest):
        private = around.url("private")
        resolve = f"dns://{plan.guest_gateway}/example.test"
        closed = [
            around.url("host", around.private.host_ip),
            around.url("resolver"),
            f"dns://{around.resolver.ip}/example.test",
        ]
        outcomes = reached(probe([private, resolve, *closed], guest))
        assert outcomes == {private: "private", resolve: RESOLVED_IP}


async def test_a_sandboxs_own_rules(network: tuple[str, str], around: Lab) -> None:
    """E2B's allowOut and denyOut on real rules: a denied host is closed, allowed wins over
    denied, an update replaces the rules whole, and allowing a private range opens nothing."""
    with peer(random_slash30("198.51.100.0/24")) as elsewhere:
        with serving("elsewhere", netns=elsewhere.netns) as port:
            internet, other = around.url("internet"), f"http://{elsewhere.ip}:{port}/"
            private = around.url("private")
            denied = parse_egress([], [elsewhere.ip])
            async with sandbox(network, 5, rules=denied) as (plan, guest):
                assert reached(probe([internet, other], guest)) == {internet: "internet"}
                only = parse_egress([f"{around.internet.ip}/32", around.private.ip], ["0.0.0.0/0"])
                await apply_policy(plan, only, EgressPolicy())
                assert reached(probe([internet, other, private], guest)) == {internet: "internet"}
                await apply_policy(plan, EgressRules(), EgressPolicy())
                both = {internet: "internet", other: "elsewhere"}
                assert reached(probe([internet, other, private], guest)) == both


# From the guest: an HTTP GET for `host` to `ip:port` (over TLS, with `host` as its SNI, if
# asked); prints the body, "closed" for a connection closed unanswered, or the failure.
FETCH_AS = r"""
import socket, ssl, sys
ip, port, host, tls = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "tls"
try:
    sock = socket.create_connection((ip, port), timeout=5)
    if tls:
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        sock = context.wrap_socket(sock, server_hostname=host)
    sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    print(data.split(b"\r\n\r\n", 1)[-1].decode() if data else "closed")
except (OSError, ssl.SSLError) as exc:
    print("failed: " + type(exc).__name__)
"""


def fetch_as(guest: str, ip: str, port: int, host: str, tls: bool = False) -> str:
    args = [ip, str(port), host, "tls" if tls else "plain"]
    return sh("ip", "netns", "exec", guest, sys.executable, "-c", FETCH_AS, *args).strip()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A self-signed certificate and its key, in one PEM file."""
    pem = tmp_path_factory.mktemp("tls") / "web.pem"
    sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
       "/CN=allowed.test", "-keyout", str(pem), "-out", str(pem))  # fmt: skip
    return str(pem)


async def test_allowed_domains_go_through_the_egress_proxy(
    network: tuple[str, str], around: Lab, certificate: str
) -> None:
    """HTTP by its Host, TLS by its SNI: an allowed name is served from the address the
    guests' resolver gives it, whatever address the guest dialled; any other name, a name
    resolving into a closed range, and every other port are refused."""
    web = around.internet
    with ExitStack() as stack:
        stack.enter_context(serving("web", netns=web.netns, port=80))
        stack.enter_context(
            serving("tls-web", kind="https", netns=web.netns, port=443, certificate=certificate)
        )
        resolvers = {}
        for name, answer in (("public", web.ip), ("private", around.private.ip)):
            at = stack.enter_context(peer(random_slash30("192.168.201.0/24")))
            stack.enter_context(serving(answer, kind="dns", netns=at.netns, address=at.ip, port=53))
            resolvers[name] = EgressPolicy(dns_server=IPv4Address(at.ip))
        rules = parse_egress(["allowed.test", "*.wild.test"], ["0.0.0.0/0"])
        proxies: list[EgressProxy] = []
        try:
            async with sandbox(network, 6, rules=rules) as (plan, guest):
                # Nothing listens at the address dialled: the proxy connects by name.
                dialled = "192.0.2.1"

                async def fetch(host: str, port: int = 80, tls: bool = False) -> str:
                    return await asyncio.to_thread(fetch_as, guest, dialled, port, host, tls)

                for resolver in ("public", "private"):
                    proxy = EgressProxy(
                        {plan.ns_ip: ("s6", rules)}.get, resolvers[resolver], network[1]
                    )
                    proxies.append(proxy)
                    ports = await proxy.start()
                    egress = dataclasses.replace(resolvers[resolver], proxy=ports)
                    await ensure_host_forwarding(network[1], network[0], ports)
                    await apply_policy(plan, rules, egress)
                    if resolver == "public":
                        assert await fetch("allowed.test") == "web"
                        assert await fetch("x.wild.test") == "web"
                        assert await fetch("allowed.test", 443, tls=True) == "tls-web"
                        assert await fetch("other.test") == "closed"
                        assert (await fetch("other.test", 443, tls=True)).startswith("failed")
                        # Other ports are not the proxy's: all traffic is denied there.
                        assert (await fetch("allowed.test", 8443)).startswith("failed")
                    else:
                        # An allowed name that resolves into a closed range is refused.
                        assert await fetch("allowed.test") == "closed"
        finally:
            for proxy in proxies:
                await proxy.close()
            await ensure_host_forwarding(network[1], network[0])
